"""CUDA C++ (sm_90a, wgmma) sparse sink attention: `csrc/cuda/fm_sparse_decode.cu`, module `deepinfer.flash_mla._C`.

Same math, conventions and split-KV plan as `triton_split_attn.py` (whose `_combine_kernel` merges the splits):
one CTA per (query token, 64-head block, split), 64-row tiles of gathered rows, both warpgroups sharing the
work without computing the scores twice (design notes at the top of the .cu file). The default kernel of
`sparse_attn_split_triton` (DEFAULT_KERNELS, or kernel="cuda"); it takes bf16 q with h a multiple of 64 and
d = 512, one cache (BF16 rows with a 16-byte aligned stride, or the V4 FP8 rows), no extra cache: `supports` says
whether a call fits (the default falls back to the Triton kernel otherwise).

`_C` is imported lazily: CPU builds (DEEPINFER_DEVICE=cpu) have none, and the repo's conftest / the benchmark put
the source tree first on sys.path, which holds no built `_C`, so the installed copy's is looked up as well.
The launcher reads shapes, strides and pointers only (no host sync): CUDA-graph safe.
"""

from __future__ import annotations

import functools
import os
import sys
import types

import torch

from ..._backend import compiled_module
from .triton_split_attn import FP8_ROW_BYTES, LOG2E, combine_splits, device_sms, plan_num_splits

__all__ = ["available", "sparse_attn_cuda", "supports"]

_PKG = __package__.rsplit(".backends", 1)[0]  # "deepinfer.flash_mla"
BLOCK_H, BLOCK_N, HEAD_DIM = 64, 64, 512


@functools.cache
def _module() -> types.ModuleType | None:
    """`deepinfer.flash_mla._C` with the sparse decode kernel, or None (not built / CPU build)."""
    mod = compiled_module()
    return mod if mod is not None and hasattr(mod, "sparse_decode") else None


def available() -> bool:
    """True when the compiled kernel is present (a DEEPINFER_DEVICE=cuda build)."""
    return _module() is not None


def supports(q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None) -> str | None:
    """None when `sparse_attn_cuda` takes this call (shapes / dtypes / device only), else why not."""
    if not available():
        return "deepinfer.flash_mla._C is not built (DEEPINFER_DEVICE=cuda)"
    if q.device.type != "cuda":
        return f"q is on {q.device}, not a CUDA device"
    if extra_kv is not None:
        return "extra_kv is not supported by the CUDA kernel"
    if q.dim() != 3 or q.dtype != torch.bfloat16 or q.shape[-1] != HEAD_DIM or q.shape[1] % BLOCK_H:
        return f"q: expected bf16 [t, 64 * n, {HEAD_DIM}], got {q.dtype} {tuple(q.shape)}"
    if kv.dtype == torch.uint8:
        return None if kv.shape[-1] == FP8_ROW_BYTES else f"kv: expected uint8 [..., {FP8_ROW_BYTES}]"
    if kv.dtype != torch.bfloat16 or kv.shape[-1] != HEAD_DIM:
        return f"kv: expected bf16 [..., {HEAD_DIM}] or uint8 [..., {FP8_ROW_BYTES}], got {kv.dtype} {tuple(kv.shape)}"
    return None


def _aligned(t: torch.Tensor, strides: tuple[int, ...], align: int = 16) -> bool:
    """Base address 16-byte aligned and every given stride (elements) a multiple of 16 bytes."""
    es = t.element_size()
    return t.data_ptr() % align == 0 and all((s * es) % align == 0 for s in strides)


def _rows(kv: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The cache as [slots, width] rows the kernel can read: BF16 16-byte aligned rows, FP8 contiguous rows."""
    fp8 = kv.dtype == torch.uint8
    flat = kv.reshape(-1, kv.shape[-1])
    if fp8:
        if not flat.is_contiguous() or flat.data_ptr() % 8:
            flat = flat.contiguous()
    elif flat.stride(-1) != 1 or not _aligned(flat, (flat.stride(0),)):
        flat = flat.contiguous()
    return flat, fp8


def sparse_attn_cuda(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse sink attention on the compiled sm_90a kernel; returns (out [t, h, 512] bf16, lse fp32 [t, h]).

    Args:
        q: bf16 [t, h, 512], h a multiple of 64 (V4: 64).
        kv: bf16 [n, 512] / [blocks, bs, 512], or uint8 FP8 rows [..., 584]; slots addressed flat.
        indices: int32 [t, topk]; -1 or any value outside [0, slots) is a hole.
        sink: fp32 [h] or None. softmax_scale: logit scale.
        out, lse_out: optional output buffers ([t, h, 512] bf16 / [t, h] fp32; copied when their strides do
            not suit the kernel).
        num_splits: splits per token (None: `plan_num_splits` at 64-row tiles for this device).
    """
    why = supports(q, kv, None)
    if why is not None:
        raise ValueError(f"sparse_attn_cuda: {why}")
    t, h, d = q.shape
    if indices.dtype != torch.int32 or indices.dim() != 2 or indices.shape[0] != t:
        raise ValueError(f"indices: expected int32 [{t}, topk], got {indices.dtype} {tuple(indices.shape)}")
    if sink is not None and (sink.dtype != torch.float32 or tuple(sink.shape) != (h,)):
        raise ValueError(f"sink: expected fp32 [{h}], got {sink.dtype} {tuple(sink.shape)}")
    if out is None:
        out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (t, h, d) or out.dtype != q.dtype:
        raise ValueError(f"out: expected {q.dtype} {(t, h, d)}, got {out.dtype} {tuple(out.shape)}")
    if lse_out is None:
        lse_out = torch.empty(t, h, dtype=torch.float32, device=q.device)
    elif tuple(lse_out.shape) != (t, h) or lse_out.dtype != torch.float32:
        raise ValueError(f"lse_out: expected float32 {(t, h)}, got {lse_out.dtype} {tuple(lse_out.shape)}")
    if t == 0:
        return out, lse_out
    kv_f, fp8 = _rows(kv)
    q_c = q if q.stride(-1) == 1 and _aligned(q, (q.stride(0), q.stride(1))) else q.contiguous()
    idx = indices if indices.stride(-1) == 1 or indices.shape[1] <= 1 else indices.contiguous()
    o_ok = out.stride(-1) == 1 and _aligned(out, (out.stride(0), out.stride(1)), 4)
    o_dst = out if o_ok else torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    sink_c = sink.contiguous() if sink is not None else None

    num_hb = h // BLOCK_H
    tiles = -(-idx.shape[1] // BLOCK_N)
    if num_splits is None:
        num_splits = plan_num_splits(t, num_hb, tiles, device_sms(q.device))
    num_splits = max(1, min(int(num_splits), max(tiles, 1)))
    per_split = -(-tiles // num_splits)
    num_splits = max(1, -(-tiles // per_split)) if tiles else 1  # no empty trailing split
    if num_splits > 1:
        part_o = torch.empty(t * num_splits * h, d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t * num_splits * h, dtype=torch.float32, device=q.device)
        po, pl = part_o.data_ptr(), part_lse.data_ptr()
    else:
        part_o = part_lse = None
        po = pl = 0
    _module().sparse_decode(
        q_c.data_ptr(), kv_f.data_ptr(), idx.data_ptr(), sink_c.data_ptr() if sink_c is not None else 0,
        o_dst.data_ptr(), lse_out.data_ptr(), po, pl,
        t, h, idx.shape[1], num_splits, per_split, float(softmax_scale) * LOG2E, kv_f.shape[0],
        idx.stride(0), q_c.stride(0), q_c.stride(1), kv_f.stride(0), o_dst.stride(0), o_dst.stride(1),
        lse_out.stride(0), lse_out.stride(1), fp8, torch.cuda.current_stream(q.device).cuda_stream,
    )  # fmt: skip
    if part_o is not None and part_lse is not None:
        combine_splits(part_o, part_lse, sink_c, o_dst, lse_out, num_splits, bf16_rne=False)
    if o_dst is not out:
        out.copy_(o_dst)
    return out, lse_out


# ------------------------------------------------------------------------------------- out-of-process probe


def self_check(seed: int = 0, device: str = "cuda") -> str:
    """Run the kernel once per cache format and split mode on a small V4 case (4 tokens x 64 heads x 640 indices,
    holes, NaN in unused slots, a token without valid index, NaN-poisoned outputs) against the reference; returns
    "" when all agree within a loose bound (it catches layout bugs, not last-bit errors: the tests do that), else
    what went wrong. device: "cpu" only to test this function with a stand-in kernel. Meant to run in a child
    process (`probe`): a kernel that faults or hangs cannot then take the caller's CUDA context down."""
    from ... import reference
    from ...kv_format import pack_fp8_kv_ref

    g = torch.Generator().manual_seed(seed)
    t, n = 4, 2048
    q = torch.randn(t, BLOCK_H, HEAD_DIM, generator=g).bfloat16().to(device)
    cache = torch.randn(n, HEAD_DIM, generator=g).bfloat16()
    idx = torch.rand(t, n - 64, generator=g).topk(640, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, 640, generator=g) < 0.05] = -1
    idx[1] = -1
    idx[2, 600:] = n + 5  # out of range: holes too
    used = torch.zeros(n, dtype=torch.bool)
    used[idx[(idx >= 0) & (idx < n)].long()] = True
    sink = torch.randn(BLOCK_H, generator=g).to(device)
    fails = []
    for fp8 in (False, True):
        kv = pack_fp8_kv_ref(cache) if fp8 else cache.clone()
        kv[~used] = 0xFF if fp8 else float("nan")  # NaN data (and NaN scales) wherever no index points
        kv, ic = kv.to(device), idx.to(device)
        ro, rl = reference.sparse_attn(q, kv, ic, sink, HEAD_DIM**-0.5)
        for splits in (None, 1):
            out = torch.full_like(q, float("nan"))
            lse = torch.full((t, BLOCK_H), float("nan"), device=device)
            sparse_attn_cuda(q, kv, ic, sink, HEAD_DIM**-0.5, out=out, lse_out=lse, num_splits=splits)
            if device != "cpu":
                torch.cuda.synchronize()
            err = (out.float() - ro).abs()
            bound = 0.02 * float(ro.abs().max()) + 1e-3
            lerr = float((lse - rl).abs().max())
            if not bool(torch.isfinite(out).all()) or float(err.max()) > bound or not lerr <= 1e-2:
                where = tuple(int(i) for i in torch.unravel_index(err.nan_to_num(1e9).argmax(), err.shape))
                fails.append(
                    f"fp8={fp8} splits={splits}: max |out - ref| {float(err.max()):.3e} (bound {bound:.3e}) at "
                    f"{where}, max |lse - ref| {lerr:.3e}, finite out {bool(torch.isfinite(out).all())}"
                )
    return "; ".join(fails)


def probe(timeout_s: float = 180.0) -> tuple[bool, str]:
    """`self_check` in a child process (same sys.path): (passed, its output). A crash, a wrong result or a hang
    (killed after timeout_s) gives False; cached per process."""
    return _probe_cached(float(timeout_s))


@functools.cache
def _probe_cached(timeout_s: float) -> tuple[bool, str]:
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.pop("TRITON_INTERPRET", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", __name__], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False, f"the CUDA kernel probe did not finish in {timeout_s:.0f} s (hang?)"
    out = (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode == 0 and "PROBE OK" in proc.stdout, out


if __name__ == "__main__":
    if not torch.cuda.is_available() or not available():
        print("PROBE FAIL: no CUDA device or no _C")
        sys.exit(1)
    why = self_check()
    print("PROBE OK" if not why else f"PROBE FAIL: {why}", flush=True)
    sys.exit(0 if not why else 1)
