"""Fast paths, selected per call in `api.py` / `api_quant.py` / `api_fused.py`.

Triton (backends/cuda/), wired into the API for CUDA tensors (fp32/bf16/fp16, no autograd) unless
DEEPINFER_TILE_KERNELS_BACKEND=reference; other calls run the PyTorch reference:
* validated on an H200 (GPU tests; which ran when: the package README): mhc_pre / mhc_head (triton_mhc.py, also
  the one-pass impl="fused", a benchmark config, not the default), mhc_post (triton_mhc_post.py), rms_norm
  (triton_norm.py), swiglu_clamp (triton_act.py), apply_rope_interleaved (triton_rope.py), the FP8 quantisers
  (triton_quant.py), softmax_pool (triton_pool.py), moe_route / hash_route (triton_route.py), the FP4 quantisers
  (triton_fp4.py), hadamard_transform and the fused hadamard_fp4_quant_dequant (triton_hadamard.py), moe_permute /
  moe_unpermute (triton_moe.py; moe_permute copies rows of any 1/2/4/8-byte dtype), swiglu_clamp_fp8 and
  kv_norm_rope_quant (triton_fused.py), stable_argsort (triton_rank_sort.py; session 10).
No compiled (CUDA C++) kernel exists.
"""

IMPLEMENTED: tuple[str, ...] = ("triton",)
