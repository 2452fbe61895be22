"""Fast paths. None wired yet: every op runs the PyTorch reference. Written and tested in Triton's CPU interpreter
but not yet run on a GPU: the radix-select top-k (`cuda/triton_topk.py`)."""

IMPLEMENTED: tuple[str, ...] = ()
