"""Fast paths. Triton, wired into the API on CUDA: mhc_pre. Triton, written and tested in the CPU interpreter but
not yet validated on a GPU and therefore not wired: rms_norm, apply_rope_interleaved, swiglu_clamp (and its fused
[.., 2n] form). Other ops: reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
