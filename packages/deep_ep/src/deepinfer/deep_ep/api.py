"""Public deep_ep API: the `Buffer` (DeepEP's dispatch / combine, normal and low-latency modes) and its handles.

Method contracts (shapes, dtypes, layouts, ordering) are in `buffer.Buffer`'s docstrings.
"""

from __future__ import annotations

from .buffer import Buffer
from .handles import DispatchHandle, LowLatencyHandle
from .reference_ll import per_token_cast_to_fp8

__all__ = ["Buffer", "DispatchHandle", "LowLatencyHandle", "per_token_cast_to_fp8"]
