"""The intranode fast path on 2+ GPUs (NCCL + torch symmetric memory) against the NCCL reference.

Dispatch (bf16, FP8, cached) must be bit-identical to the reference; combine too with 2 ranks (two fp32
additions commute), within `ep_fast.combine_bound` with more. Both row movers (Triton, torch) run.
The low-latency fast path: rows / counts bit-identical to reference_ll, combine within one bf16 ulp, and a
CUDA graph of dispatch + combine replayed 3 times equal to the eager call.
"""

from __future__ import annotations

import pytest
import torch
from ep_worker import launch

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_fast_path_two_gpus_matches_reference() -> None:
    """Both movers at V4-Flash shapes vs the NCCL reference, synced and num_worst_tokens (no-sync with the
    Triton movers: bit-exact received rows, padding, counts tensor, W too small flagged, CUDA graph == eager)."""
    launch(2, seed=51, timeout_s=420.0, env=NO_MULTICAST, scenario="cuda")


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_low_latency_fast_path_two_gpus() -> None:
    """LL fast path vs reference_ll at 1 / 32 / 128 tokens (V4-Flash shapes), then CUDA graph replays == eager."""
    launch(2, seed=71, timeout_s=300.0, env=NO_MULTICAST, scenario="llcuda")


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_overlap_variant_two_gpus() -> None:
    """dispatch(num_worst_tokens=W, overlap=True) + its combine (the no-sync default since session 5) vs the
    NCCL reference at V4-Flash shapes (uneven ranks incl. an empty one), then CUDA-graph replays == eager."""
    launch(2, seed=91, timeout_s=420.0, env=NO_MULTICAST, scenario="overlapcuda")


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_overlap_mixed_order_two_gpus() -> None:
    """The same checks with DEEPINFER_DEEP_EP_OVERLAP_ORDER=mixed (session 5, never run on GPUs yet: copy-out programs
    launched first, pushes and own-block copies interleaved): bit-exact vs NCCL, graph replays == eager."""
    env = {**NO_MULTICAST, "DEEPINFER_DEEP_EP_OVERLAP_ORDER": "mixed"}
    launch(2, seed=93, timeout_s=300.0, env=env, scenario="overlapmixedcuda")


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_overlap_combine_configs_two_gpus() -> None:
    """The overlapped combine with DEEPINFER_DEEP_EP_OVERLAP_COMBINE = wide / wide4 (session 5, passed in round 3;
    the worker sets each): dispatch + combine bit-exact vs NCCL at V4-Flash shapes, graph replays == eager."""
    launch(2, seed=97, timeout_s=240.0, env=NO_MULTICAST, scenario="overlapcombcuda")


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_overlap_dispatch_configs_two_gpus() -> None:
    """The overlapped dispatch with DEEPINFER_DEEP_EP_OVERLAP_DISPATCH = early / fused (session 6; early is the
    default since session 6 run 3, fused opt-in; the worker sets each; mixed order, the default) vs the NCCL
    reference at V4-Flash shapes (uneven ranks incl. an empty one; fused also 7168 x top-8 of 64 and CUDA-graph
    replays == eager), then base, the session-5 kernel (epochs in step)."""
    launch(2, seed=95, timeout_s=240.0, env=NO_MULTICAST, scenario="overlapdispcuda")


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_overlap_combine_fold_configs_two_gpus() -> None:
    """The overlapped combine with DEEPINFER_DEEP_EP_OVERLAP_COMBINE = fold / wide_fold / send2 / wide_fold_send2
    (session 6, opt-in; the worker sets each): combine bit-exact vs NCCL at V4-Flash shapes; for wide_fold_send2 a
    CUDA graph of dispatch + combine replayed 3 times == eager (the folded epoch must advance on every replay)."""
    launch(2, seed=99, timeout_s=240.0, env=NO_MULTICAST, scenario="overlapfoldcuda")
