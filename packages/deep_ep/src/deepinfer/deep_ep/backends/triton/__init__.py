"""Triton kernels of the intranode fast path: the fused dispatch (layout, row push, copy-out; `fused.py`),
the row gather and the combine reduction (`rows.py`)."""
