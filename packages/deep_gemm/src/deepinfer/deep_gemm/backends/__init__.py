"""Fast paths. Triton: the FP4-weight grouped GEMM. cuBLAS (CUDA): the bf16 GEMMs. Other ops: reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
