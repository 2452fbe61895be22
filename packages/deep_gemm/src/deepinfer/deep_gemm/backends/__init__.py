"""Fast paths. Wired on CUDA: the Triton FP4-weight grouped GEMM (`cuda/triton_fp4_grouped.py`, second kernel in
`cuda/triton_fp4_grouped_v2.py`, configs in `cuda/w4a16_configs.py`), the Triton block-scaled FP8 GEMM for
`fp8_gemm_nt` (`cuda/triton_fp8_gemm.py`) and cuBLAS for the bf16 GEMMs. Written and tested in Triton's CPU
interpreter but not yet run on a GPU, so not wired: the grouped FP8 GEMMs (`cuda/triton_fp8_grouped.py`).
Other ops: reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
