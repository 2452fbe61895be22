"""Fast paths. Wired on CUDA: the Triton FP4-weight grouped GEMM and cuBLAS for the bf16 GEMMs. Written and
tested in Triton's CPU interpreter but not yet run on a GPU, so not wired: the block-scaled FP8 GEMM
(`triton_fp8_gemm.py`). Other ops: reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
