"""Fast-path implementations. No fast path yet: every op runs the PyTorch reference."""

IMPLEMENTED: tuple[str, ...] = ()
