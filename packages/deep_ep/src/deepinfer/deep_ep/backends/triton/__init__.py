"""Triton kernels of the intranode fast path: row gather into (peer) buffers, and the combine reduction."""
