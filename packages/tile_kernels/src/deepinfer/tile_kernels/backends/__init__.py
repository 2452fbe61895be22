"""Fast-path implementations. Triton: mhc_pre. Other ops: reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
