"""Fast-path implementations. Triton (CUDA, or CPU under TRITON_INTERPRET=1 when forced): sparse attention for
BF16 and FP8 caches (`cuda/triton_split_attn.py`; fp32 operands on a GPU use `cuda/triton_sparse_attn.py`).
The other ops (FP8 pack / unpack) run the PyTorch reference.
"""

IMPLEMENTED: tuple[str, ...] = ("triton",)
