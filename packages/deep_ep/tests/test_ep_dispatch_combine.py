"""Dispatch + combine (normal and low-latency, BF16 and FP8) on 1 rank in-process and on 2 / 3 gloo ranks."""

from __future__ import annotations

from ep_worker import launch, run_all


def test_world_size_1() -> None:
    run_all(None, seed=11)


def test_gloo_3_and_2_ranks() -> None:
    """Three spawned ranks run every scenario, then ranks 0 and 1 run them again as a 2-rank subgroup."""
    launch(3, seed=20)


def test_fast_path_gloo_shm_3_and_2_ranks_triton() -> None:
    """The intranode fast path on CPU (shared memory, Triton interpreter) against the reference."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "triton"}
    launch(3, seed=31, timeout_s=120.0, env=env, scenario="fast")


def test_fast_path_gloo_shm_2_ranks_torch_movers() -> None:
    """The same with the torch row movers (index_select / index_add_) instead of the Triton kernels."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "torch"}
    launch(2, seed=41, timeout_s=120.0, env=env, scenario="fast")


def test_low_latency_fast_path_gloo_shm_2_ranks() -> None:
    """The low-latency fast path on CPU (shared memory, Triton interpreter) against reference_ll."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1"}
    launch(2, seed=61, timeout_s=150.0, env=env, scenario="llfast")


def test_overlap_variant_gloo_shm_3_and_2_ranks() -> None:
    """dispatch(num_worst_tokens=W, overlap=True) and its combine (prepared in session 4) on CPU: shared memory,
    Triton interpreter, the waits across processes; bit-exact with the reference, padding, counts, W too small."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "triton"}
    launch(3, seed=81, timeout_s=150.0, env=env, scenario="overlap")


def test_overlap_mixed_order_gloo_shm_3_ranks() -> None:
    """The overlapped variant with DEEPINFER_DEEP_EP_OVERLAP_ORDER=mixed (pushes and own-block copies
    interleaved; in the interpreter the copy-out programs stay last) on 3 processes, then 2: bit-exact."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "triton"}
    env["DEEPINFER_DEEP_EP_OVERLAP_ORDER"] = "mixed"
    launch(3, seed=87, timeout_s=150.0, env=env, scenario="overlapmixed")


def test_overlap_combine_configs_gloo_shm_2_ranks() -> None:
    """The overlapped combine with DEEPINFER_DEEP_EP_OVERLAP_COMBINE = wide / wide4 (2x / 4x the tokens per
    reduce program; the worker sets each) on 2 processes: bit-exact with the reference."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "triton"}
    launch(2, seed=89, timeout_s=150.0, env=env, scenario="overlapcomb")


def test_overlap_dispatch_configs_gloo_shm_3_ranks() -> None:
    """The overlapped dispatch with DEEPINFER_DEEP_EP_OVERLAP_DISPATCH = early / fused (session 6: the rows per rank
    published first with their own flag; + the layout scan inside the launch; the worker sets each) on 3
    processes, then 2: bit-exact with the reference."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "triton"}
    launch(3, seed=83, timeout_s=150.0, env=env, scenario="overlapdisp")


def test_overlap_combine_fold_configs_gloo_shm_2_ranks() -> None:
    """The overlapped combine with the session-6 configs (fold, wide_fold, send2, wide_fold_send2; the worker sets
    each) on 2 processes: bit-exact with the reference, and the epochs stay in step across configs."""
    env = {"DEEPINFER_DEEP_EP_BACKEND": "triton", "TRITON_INTERPRET": "1", "DEEPINFER_DEEP_EP_IMPL": "triton"}
    launch(2, seed=85, timeout_s=150.0, env=env, scenario="overlapfold")
