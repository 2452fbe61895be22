"""Selection behind the public API: the CUDA C++ kernel (`cuda_topk.py`) when `_C` was built and the backend
is "cuda" (its split `topk_cuda_split` for few long rows, see `cuda_topk.choose_split`, else one CTA per row in
`cuda_topk.DEFAULT_MODE`), else the Triton chain: split rows (few long rows), else v3, else v2, else v1.

The CUDA kernel, like every Triton kernel, falls back to the next one with one RuntimeWarning should it fail to
launch. The API calls these only on CUDA tensors (or CPU tensors when the Triton backend is forced under
TRITON_INTERPRET=1). Row-wise calls with too few rows to fill the GPU (`triton_split.choose_segments`) cut each
row into segments (`triton_split.py`, CUDA only); everything else runs v3 (`triton_filter.py`). Should a kernel
fail (compile or launch) on some Triton version, its first failure is reported once as a RuntimeWarning and the
next one serves from then on: split -> v3 -> v2 -> the GPU-validated v1 (row-wise calls only: ragged calls need
`starts`, which v1 lacks, so they raise).
"""

from __future__ import annotations

import functools
import warnings

import torch

from . import cuda_topk
from .cuda_topk import available as cuda_available
from .cuda_topk import choose_split, topk_cuda, topk_cuda_split

__all__ = ["select_indices"]

# Few long rows run the CUDA split (`topk_cuda_split`) where `cuda_topk.choose_split` says so (its rule depends on
# the segments' mode; lean since session 4); set False to give those shapes to the one-CTA-per-row kernel again.
SPLIT_ENABLED = True
_FAILED: dict[str, str] = {}  # kernel name -> its first failure (that kernel is skipped from then on)


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _warn_failed(name: str, exc: Exception) -> None:
    _FAILED[name] = f"{type(exc).__name__}: {exc}"
    warnings.warn(f"deep_select: top-k kernel {name} failed: {_FAILED[name]}", RuntimeWarning, stacklevel=3)


def select_indices(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    impl: str = "triton",
) -> torch.Tensor:
    """Unsorted top-k ids int32 [b, k] of scores [b, n] (-1 padded), as `topk_triton_v3`.

    impl: "cuda" tries the compiled kernel first (CUDA tensors, `_C` built), then the Triton chain; "triton"
    runs the Triton chain only.
    """
    fits = scores.shape[1] < 2**31  # the CUDA kernel's column ids are int32 keys
    if impl == "cuda" and scores.is_cuda and fits and cuda_available() and "cuda" not in _FAILED:
        try:
            return _select_cuda(scores, k, lengths, starts, out)
        except RuntimeError as exc:  # launch failure: report once, then the Triton chain serves
            _warn_failed("cuda", exc)
    return _select_triton(scores, k, lengths, starts, out)


def _select_cuda(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    starts: torch.Tensor | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The CUDA C++ kernel: split rows (few long rows, row-wise calls) when SPLIT_ENABLED, else one CTA per row."""
    b, n = scores.shape
    segs = 1
    # the segments run DEFAULT_MODE when it is a split mode (fast / lean / lean_pf), else fast; the rule depends on it
    mode = cuda_topk.DEFAULT_MODE if cuda_topk.DEFAULT_MODE in cuda_topk.SPLIT_MODES else "fast"
    if SPLIT_ENABLED and starts is None:
        segs = choose_split(b, n, k, _num_sms(scores.device.index or 0), mode=mode)
    if segs > 1:
        return topk_cuda_split(scores, k, segs, lengths=lengths, out=out, mode=mode)
    return topk_cuda(scores, k, lengths=lengths, starts=starts, out=out)


def _select_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    starts: torch.Tensor | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The Triton chain: split (few long rows) -> v3 -> v2 -> v1. Imports triton on first use."""
    from .triton_filter import topk_triton_v3
    from .triton_select import topk_triton_v2
    from .triton_split import choose_segments, topk_triton_split
    from .triton_topk import topk_triton

    segments = 1
    if starts is None and scores.device.type == "cuda":
        segments = choose_segments(scores.shape[0], scores.shape[1], k, _num_sms(scores.device.index or 0))
    kernels = {
        "split": lambda: topk_triton_split(scores, k, segments, lengths=lengths, out=out),
        "v3": lambda: topk_triton_v3(scores, k, lengths=lengths, starts=starts, out=out),
        "v2": lambda: topk_triton_v2(scores, k, lengths=lengths, starts=starts, out=out),
    }
    if segments == 1:
        del kernels["split"]
    for name, run in kernels.items():
        if name in _FAILED:
            continue
        try:
            return run()
        except Exception as exc:  # compile / launch failure of a new kernel: fall back to the next one
            _warn_failed(name, exc)
    if starts is not None:
        raise RuntimeError(f"deep_select: ragged top-k needs the v3 or v2 kernel, which failed: {_FAILED}")
    return topk_triton(scores, k, lengths=lengths, out=out)
