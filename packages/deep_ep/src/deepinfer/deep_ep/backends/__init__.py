"""Fast paths. Triton (CUDA, or Triton's CPU interpreter when forced): the intranode normal-mode dispatch /
combine over peer-writable buffers (`intranode.py`, kernels in `backends/triton/rows.py`). Low-latency mode
and world size 1 run the reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
