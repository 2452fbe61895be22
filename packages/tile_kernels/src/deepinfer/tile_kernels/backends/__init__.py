"""Fast paths, selected per call in `api.py` / `api_quant.py` / `api_fused.py`.

Triton (backends/cuda/), wired into the API for CUDA tensors (fp32/bf16/fp16, no autograd) unless
DEEPINFER_TILE_KERNELS_BACKEND=reference; other calls run the PyTorch reference:
* validated on an H200: mhc_pre (triton_mhc.py; hc a power of two >= 4); rms_norm (triton_norm.py, d <= 16384),
  swiglu_clamp (triton_act.py; also a fused [.., 2n] launcher the API does not use) and apply_rope_interleaved
  (triton_rope.py). RoPE: its one H200 miss (1 bf16 ulp at 4096 tokens) came from FMA contraction; the kernel
  now launches with fp fusion off (bit-identical to the reference), which has not run on a GPU yet.
* not yet run on a GPU (CPU interpreter tests only): fp8_quant_ue8m0 / fp8_quant_dequant_ue8m0 /
  per_token_group_quant_fp8 (triton_quant.py, power-of-two blocks, bit-exact), softmax_pool (triton_pool.py,
  slots <= 1024), moe_route (triton_route.py, E <= 4096, topk <= 16), swiglu_clamp_fp8 and
  kv_norm_rope_quant (triton_fused.py).
No compiled (CUDA C++) kernel exists.
"""

IMPLEMENTED: tuple[str, ...] = ("triton",)
