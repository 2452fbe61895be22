"""Triton mHC pre and head (`ref/mhc.py::mhc_pre`, `mhc_head`): RMS-scaled mixing logits, gates, Sinkhorn
(pre only) and the stream mix.

Two launches (instead of ~120 small kernels), both over a (token block, split) grid so that a single decode
token still spreads over the whole GPU:

* `_mhc_mix_kernel`: program (b, s) takes BLOCK_T tokens and the s-th slice of the flattened hc*d axis and
  writes fp32 partials of `x_flat @ fn^T` (tensor-core `tl.dot`s with ~fp32 accuracy: see DOT_PRECISION)
  and of sum(x^2). The fn rows go into padded slots, NP = 2*HC*HC, so that the [BLOCK_T, NP] result
  reshapes to [BLOCK_T, 2, HC, HC]: half 0 holds the pre logits (row 0) and post logits (row 1), its other
  rows are zero; half 1 is the HC x HC comb logit matrix (fn row 2*HC + HC*i + j -> slot HC*HC + HC*i + j).
* `_mhc_finish_kernel`: program (b, s) sums the partials of BLOCK_T tokens, forms the gates and the Sinkhorn
  projection in registers on [BLOCK_T, HC, HC] tiles (split 0 stores post and comb) and writes the s-th slice
  of x_in = sum_i pre[i] * x[:, i, :] in x.dtype.

The head (HEAD=True) is the same two launches with hc fn rows in the pre-gate slots 0..HC-1 (the rest of the
padded slots zero): its weights sigmoid(m * scale[0] + base[:hc]) + eps are exactly mhc_pre's pre gates, and
the finish kernel skips post, comb and Sinkhorn. Both ops read x twice (mix, then the stream mix): the mix
needs the whole [hc * d] row of a token before any weight is known, and a token block's row (BLOCK_T x 32 KB
at V4 width) is too large to keep on chip or in L2 across all SMs.

All math is fp32; the launchers do no host sync (CUDA-graph safe) and their splits depend only on shapes.

`impl="fused"` (`triton_mhc_fused.py`, a benchmark config, slower: package README) does both steps in one launch,
re-reading each token block from L2 instead of HBM. `DEFAULT_IMPL` names what the launchers (and so the API) run
without an `impl` argument.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

__all__ = ["mhc_head_triton", "mhc_pre_triton"]

MIX_BLOCK_K = 64  # flattened hc*d columns per mix step
MIX_MAX_BLOCK_T = 64  # tokens per mix program for large t (fn tiles are reused by that many tokens)
MIX_MAX_SPLITS = 64  # most hc*d slices per token block (the finish kernel sums that many partials)
MIX_NUM_WARPS = 4
MIX_NUM_STAGES = 3
FIN_BLOCK_T = 4  # tokens per finish program
FIN_BLOCK_D = 256  # d columns per finish step
FIN_BLOCK_S = 8  # partials summed per finish step
FIN_NUM_WARPS = 4
# Mix dot precision. "auto": "bf16x3" for bf16 x on a GPU, else "tf32x3". "bf16x3": fn split into three bf16
# terms (exact to ~2^-24) times the exact bf16 x, fp32 accumulation. "tf32x3": Triton's 3xTF32 (~fp32).
# "ieee": exact fp32 on CUDA cores (3.5x slower than tf32x3 at t = 16k). The interpreter computes every
# variant in fp32 (its bf16 tl.dot is wrong, so "bf16x3" is never picked there).
DOT_PRECISION = "auto"
# two launches (this module) | one launch (triton_mhc_fused.py; 0.09-0.68x of the two launches on the H200)
IMPLS = ("split", "fused")
DEFAULT_IMPL = "split"
# impl="split" configs: "default" only (session 5's "finish_rev", the finish launch taking the token blocks
# last-first, ran 1.00x / 0.98x at 16,384 tokens on the H200 in session 6 and was removed; see the README)
SPLIT_CONFIGS = ("default",)


@triton.jit
def _mix_partials(
    x_ptr,
    fn_ptr,
    part_ptr,
    sq_ptr,
    T,
    pid_t,
    pid_s,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_fn_r,
    stride_fn_c,
    k_per_split,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD: tl.constexpr,
):
    """Split pid_s of token block pid_t: part[pid_s, tokens] = x_flat @ fn_slots^T, sq = sum(x^2), the body of
    `_mhc_mix_kernel` (padded slots: module docstring) and of the one-launch variants' mix step."""
    NP: tl.constexpr = 2 * HC * HC
    K: tl.constexpr = HC * D
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    x_tok = x_ptr + tok.to(tl.int64) * stride_xt
    p = tl.arange(0, NP)
    if HEAD:
        fn_row = tl.where(p < HC, p, -1)
    else:
        fn_row = tl.where(p < 2 * HC, p, tl.where(p >= HC * HC, p - HC * HC + 2 * HC, -1))
    fn_rows_ptr = fn_ptr + tl.maximum(fn_row, 0).to(tl.int64) * stride_fn_r
    fn_rmask = fn_row >= 0
    kk = tl.arange(0, BLOCK_K)
    k_lo = pid_s * k_per_split
    acc = tl.zeros([BLOCK_T, NP], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        k = k_lo + k0 + kk
        kmask = k < K
        xr = tl.load(
            x_tok[:, None] + ((k // D) * stride_xh + (k % D) * stride_xd)[None, :],
            mask=tmask[:, None] & kmask[None, :],
            other=0.0,
        )
        fv = tl.load(
            fn_rows_ptr[None, :] + k[:, None].to(tl.int64) * stride_fn_c,
            mask=fn_rmask[None, :] & kmask[:, None],
            other=0.0,
        ).to(tl.float32)
        xv = xr.to(tl.float32)
        sq += xv * xv
        if PRECISION == "bf16x3":  # x is bf16: fn = f1 + f2 + f3 in bf16, each product exact in fp32
            f1 = fv.to(tl.bfloat16)
            r1 = fv - f1.to(tl.float32)
            f2 = r1.to(tl.bfloat16)
            f3 = (r1 - f2.to(tl.float32)).to(tl.bfloat16)
            acc = tl.dot(xr, f3, acc)
            acc = tl.dot(xr, f2, acc)
            acc = tl.dot(xr, f1, acc)
        else:
            acc = tl.dot(xv, fv, acc, input_precision=PRECISION)
    row = pid_s * T + tok.to(tl.int64)
    tl.store(part_ptr + row[:, None] * NP + p[None, :], acc, mask=tmask[:, None])
    tl.store(sq_ptr + row, tl.sum(sq, axis=1), mask=tmask)


@triton.jit
def _mhc_mix_kernel(
    x_ptr,
    fn_ptr,
    part_ptr,
    sq_ptr,
    T,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_fn_r,
    stride_fn_c,
    k_per_split,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD: tl.constexpr,
):
    """x [T, HC, D] (strided), fn [(2+HC)*HC, HC*D] (HEAD: [HC, HC*D]) -> part [S, T, 2*HC*HC], sq [S, T] fp32."""
    _mix_partials(
        x_ptr, fn_ptr, part_ptr, sq_ptr, T, tl.program_id(0), tl.program_id(1), stride_xt, stride_xh, stride_xd,
        stride_fn_r, stride_fn_c, k_per_split, HC, D, BLOCK_T, BLOCK_K, PRECISION, HEAD,
    )  # fmt: skip


@triton.jit
def _mhc_finish_kernel(
    part_ptr,
    sq_ptr,
    x_ptr,
    scale_ptr,
    base_ptr,
    xin_ptr,
    post_ptr,
    comb_ptr,
    T,
    S,
    stride_xt,
    stride_xh,
    stride_xd,
    d_per_split,
    rms_eps,
    hc_eps,
    sinkhorn_iters,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD: tl.constexpr,
):
    """part [S, T, 2*HC*HC], sq [S, T], x [T, HC, D] -> xin [T, D] (x dtype), post [T, HC], comb [T, HC, HC].

    HEAD: only xin (the head's output); post_ptr / comb_ptr are not touched.
    """
    NP: tl.constexpr = 2 * HC * HC
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    tok64 = tok.to(tl.int64)
    p = tl.arange(0, NP)

    # sum the S partials, BLOCK_S at a time, in a fixed order (deterministic)
    sb = tl.arange(0, BLOCK_S)
    acc3 = tl.zeros([BLOCK_S, BLOCK_T, NP], dtype=tl.float32)
    ss2 = tl.zeros([BLOCK_S, BLOCK_T], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        row = (s0 + sb)[:, None].to(tl.int64) * T + tok64[None, :]  # [BS, BT]
        rmask = ((s0 + sb) < S)[:, None] & tmask[None, :]
        acc3 += tl.load(part_ptr + row[:, :, None] * NP + p[None, None, :], mask=rmask[:, :, None], other=0.0)
        ss2 += tl.load(sq_ptr + row, mask=rmask, other=0.0)
    acc = tl.sum(acc3, axis=0)  # [BT, NP]
    r = 1.0 / tl.sqrt(tl.sum(ss2, axis=0) / (HC * D) + rms_eps)  # [BT]
    m4 = tl.reshape(acc * r[:, None], [BLOCK_T, 2, HC, HC])

    # split the logits: half 0 -> pre (row 0) and post (row 1); half 1 -> comb (sums with exact zeros)
    h4 = tl.arange(0, 2)[None, :, None, None]
    pp = tl.sum(tl.where(h4 == 0, m4, 0.0), axis=1)  # [BT, HC, HC]
    ri = tl.arange(0, HC)[None, :, None]  # row index of a [.., HC, HC] tile
    cj = tl.arange(0, HC)[None, None, :]  # column index
    hh = tl.arange(0, HC)
    pre_l = tl.sum(tl.where(ri == 0, pp, 0.0), axis=1)  # [BT, HC]
    s0 = tl.load(scale_ptr).to(tl.float32)
    b_pre = tl.load(base_ptr + hh).to(tl.float32)
    pre = 1.0 / (1.0 + tl.exp(-(pre_l * s0 + b_pre[None, :]))) + hc_eps  # [BT, HC]
    if not HEAD:
        post_l = tl.sum(tl.where(ri == 1, pp, 0.0), axis=1)
        s1 = tl.load(scale_ptr + 1).to(tl.float32)
        s2 = tl.load(scale_ptr + 2).to(tl.float32)
        b_post = tl.load(base_ptr + HC + hh).to(tl.float32)
        b_comb = tl.load(base_ptr + 2 * HC + ri * HC + cj).to(tl.float32)  # [1, HC, HC]
        post = 2.0 / (1.0 + tl.exp(-(post_l * s1 + b_post[None, :])))

        # Sinkhorn: softmax rows + eps, columns, then (iters - 1) x (rows, columns)
        cl = tl.sum(tl.where(h4 == 1, m4, 0.0), axis=1)  # [BT, HC, HC]
        z = cl * s2 + b_comb
        e = tl.exp(z - tl.max(z, axis=2)[:, :, None])
        c = e / tl.sum(e, axis=2)[:, :, None] + hc_eps
        c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
        for _ in range(sinkhorn_iters - 1):
            c = c / (tl.sum(c, axis=2)[:, :, None] + hc_eps)
            c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)

        smask = tmask & (tok * 0 + pid_s == 0)  # split 0 stores post / comb (a tensor mask: the interpreter needs one)
        tl.store(post_ptr + tok64[:, None] * HC + hh[None, :], post, mask=smask[:, None])
        tl.store(comb_ptr + tok64[:, None, None] * (HC * HC) + ri * HC + cj, c, mask=smask[:, None, None])

    # x_in slice: columns [pid_s * d_per_split, (pid_s + 1) * d_per_split)
    x_tok = x_ptr + tok64 * stride_xt
    dd = tl.arange(0, BLOCK_D)
    h3 = hh[None, :, None]
    for d0 in range(0, d_per_split, BLOCK_D):
        col = pid_s * d_per_split + d0 + dd
        cmask = col < D
        xv = tl.load(
            x_tok[:, None, None] + h3 * stride_xh + col[None, None, :] * stride_xd,
            mask=tmask[:, None, None] & cmask[None, None, :],
            other=0.0,
        ).to(tl.float32)  # [BT, HC, BD]
        y = tl.sum(xv * pre[:, :, None], axis=1)  # [BT, BD]
        tl.store(
            xin_ptr + tok64[:, None] * D + col[None, :],
            y.to(xin_ptr.dtype.element_ty),
            mask=tmask[:, None] & cmask[None, :],
        )


@functools.cache
def _target_programs(device: torch.device) -> int:
    """Programs per launch worth aiming for: 2 per SM on a GPU; 4 under the CPU interpreter (exercises splits)."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _split(n_blocks: int, n_chunks: int, target: int, max_splits: int) -> tuple[int, int]:
    """Split n_chunks work chunks so n_blocks * splits reaches ~target programs -> (splits, chunks per split)."""
    per = triton.cdiv(n_chunks, max(1, min(n_chunks, max_splits, triton.cdiv(target, n_blocks))))
    return triton.cdiv(n_chunks, per), per


def _mix_block_t(t: int) -> int:
    """Tokens per mix program: 16 (tl.dot minimum) for decode, up to MIX_MAX_BLOCK_T for large t."""
    return min(MIX_MAX_BLOCK_T, 16 if t <= 16 else 32 if t <= 512 else 128)


def _launch_mix(x: torch.Tensor, fn: torch.Tensor, head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the mix kernel on x [t, hc, d] -> (part [S, t, 2*hc*hc], sq [S, t]) fp32 partials over S slices."""
    t, hc, d = x.shape
    bt = _mix_block_t(t)
    bk = min(MIX_BLOCK_K, max(16, triton.next_power_of_2(hc * d)))
    n_tb = triton.cdiv(t, bt)
    ks, k_chunks = _split(n_tb, triton.cdiv(hc * d, bk), _target_programs(x.device), MIX_MAX_SPLITS)
    prec = DOT_PRECISION
    if prec == "auto":
        prec = "bf16x3" if x.dtype == torch.bfloat16 and x.device.type == "cuda" else "tf32x3"
    part = torch.empty((ks, t, 2 * hc * hc), dtype=torch.float32, device=x.device)
    sq = torch.empty((ks, t), dtype=torch.float32, device=x.device)
    _mhc_mix_kernel[(n_tb, ks)](
        x,
        fn,
        part,
        sq,
        t,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        fn.stride(0),
        fn.stride(1),
        k_chunks * bk,
        HC=hc,
        D=d,
        BLOCK_T=bt,
        BLOCK_K=bk,
        PRECISION=prec,
        HEAD=head,
        num_warps=MIX_NUM_WARPS,
        num_stages=MIX_NUM_STAGES,
    )
    return part, sq


def _launch_finish(
    part: torch.Tensor,
    sq: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    rms_eps: float,
    hc_eps: float,
    sinkhorn_iters: int,
    head: bool = False,
) -> None:
    """Run the finish kernel: partials + x [t, hc, d] -> out = (x_in [t, d], post [t, hc], comb [t, hc, hc]).

    head: only x_in is written (post and comb may be any tensors, e.g. x_in again).
    """
    t, hc, d = x.shape
    bd = min(FIN_BLOCK_D, triton.next_power_of_2(d))
    n_tb = triton.cdiv(t, FIN_BLOCK_T)
    ds, d_chunks = _split(n_tb, triton.cdiv(d, bd), _target_programs(x.device), 1 << 30)
    _mhc_finish_kernel[(n_tb, ds)](
        part,
        sq,
        x,
        scale,
        base,
        *out,
        t,
        part.shape[0],
        x.stride(0),
        x.stride(1),
        x.stride(2),
        d_chunks * bd,
        float(rms_eps),
        float(hc_eps),
        int(sinkhorn_iters),
        HC=hc,
        D=d,
        BLOCK_T=FIN_BLOCK_T,
        BLOCK_D=bd,
        BLOCK_S=FIN_BLOCK_S,
        HEAD=head,
        num_warps=FIN_NUM_WARPS,
    )


def _check_out(name: str, o: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Raise unless the output buffer `o` is contiguous with the given shape, dtype and device."""
    if tuple(o.shape) != shape or o.dtype != dtype or o.device != device or not o.is_contiguous():
        raise ValueError(
            f"out {name} must be contiguous {dtype} {list(shape)} on {device}, "
            f"got {o.dtype} {list(o.shape)} on {o.device} (contiguous={o.is_contiguous()})"
        )


def _check_impl(impl: str | None, config: str = "default") -> str:
    """impl, or DEFAULT_IMPL for None; raise unless it is one of IMPLS (and, for "split", config one of
    SPLIT_CONFIGS; "fused" checks its own configs)."""
    impl = DEFAULT_IMPL if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, got {impl!r}")
    if impl == "split" and config not in SPLIT_CONFIGS:
        raise ValueError(f"impl='split' takes config one of {SPLIT_CONFIGS}, got {config!r}")
    return impl


def _check_x(x: torch.Tensor) -> tuple[int, int, int]:
    """Raise unless x is [t, hc, d] with hc a power of two >= 4; return its shape."""
    if x.dim() != 3:
        raise ValueError(f"x must be [t, hc, d], got shape {tuple(x.shape)}")
    t, hc, d = x.shape
    if hc < 4 or hc & (hc - 1):
        raise ValueError(f"hc must be a power of two >= 4 (tl.dot needs 2*hc*hc >= 16), got {hc}")
    return t, hc, d


def mhc_pre_triton(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    sinkhorn_iters: int = 20,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    impl: str | None = None,
    config: str = "default",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused mHC pre, same contract as `ref.mhc.mhc_pre`.

    x: [t, hc, d] bf16/fp16/fp32 (any strides); fn: [(2+hc)*hc, hc*d] (any strides, read as fp32);
    scale: [3]; base: [(2+hc)*hc]. hc must be a power of two >= 4 (V4: 4).
    Returns x_in [t, d] (x.dtype, contiguous), post [t, hc] fp32, comb [t, hc, hc] fp32; written into `out`
    (contiguous tensors of exactly those shapes and dtypes) when it is given, else freshly allocated.
    impl: "split" (two launches; `config` one of SPLIT_CONFIGS) or "fused" (one launch, `triton_mhc_fused.py`, with
    its named `config`); None: DEFAULT_IMPL.
    Shape checks only; no host sync, so it can be captured in a CUDA graph.
    """
    impl = _check_impl(impl, config)
    t, hc, d = _check_x(x)
    if tuple(fn.shape) != ((2 + hc) * hc, hc * d):
        raise ValueError(f"fn must have shape {((2 + hc) * hc, hc * d)}, got {tuple(fn.shape)}")
    if scale.numel() < 3 or base.numel() != (2 + hc) * hc:
        raise ValueError(f"scale needs 3 and base {(2 + hc) * hc} values, got {scale.numel()} and {base.numel()}")
    dev = x.device
    if out is None:
        x_in = torch.empty((t, d), dtype=x.dtype, device=dev)
        post = torch.empty((t, hc), dtype=torch.float32, device=dev)
        comb = torch.empty((t, hc, hc), dtype=torch.float32, device=dev)
    else:
        x_in, post, comb = out
        _check_out("x_in", x_in, (t, d), x.dtype, dev)
        _check_out("post", post, (t, hc), torch.float32, dev)
        _check_out("comb", comb, (t, hc, hc), torch.float32, dev)
    if t == 0 or d == 0:
        return x_in, post, comb
    scale, base = scale.reshape(-1).contiguous(), base.reshape(-1).contiguous()
    if impl == "fused":
        from .triton_mhc_fused import mhc_fused_triton

        mhc_fused_triton(x, fn, scale, base, (x_in, post, comb), rms_eps, hc_eps, sinkhorn_iters, False, config)
        return x_in, post, comb
    part, sq = _launch_mix(x, fn)
    _launch_finish(part, sq, x, scale, base, (x_in, post, comb), rms_eps, hc_eps, sinkhorn_iters)
    return x_in, post, comb


def mhc_head_triton(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    impl: str | None = None,
    config: str = "default",
) -> torch.Tensor:
    """Fused mHC head, same contract as `ref.mhc.mhc_head`: two launches (mix partials, gates + stream sum), or
    one with impl="fused" (see `mhc_pre_triton`; None: DEFAULT_IMPL).

    x: [t, hc, d] bf16/fp16/fp32 (any strides); fn: [hc, hc*d] (any strides, read as fp32); scale: [1];
    base: [hc]. hc must be a power of two >= 4 (V4: 4). Returns [t, d] in x.dtype, contiguous.
    Shape checks only; no host sync, so it can be captured in a CUDA graph.
    """
    impl = _check_impl(impl, config)
    t, hc, d = _check_x(x)
    if tuple(fn.shape) != (hc, hc * d):
        raise ValueError(f"fn must have shape {(hc, hc * d)}, got {tuple(fn.shape)}")
    if scale.numel() < 1 or base.numel() != hc:
        raise ValueError(f"scale needs 1 and base {hc} values, got {scale.numel()} and {base.numel()}")
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t == 0 or d == 0:
        return out
    scale, base = scale.reshape(-1).contiguous(), base.reshape(-1).contiguous()
    if impl == "fused":
        from .triton_mhc_fused import mhc_fused_triton

        mhc_fused_triton(x, fn, scale, base, (out, out, out), rms_eps, hc_eps, 1, True, config)
        return out
    part, sq = _launch_mix(x, fn, head=True)
    _launch_finish(part, sq, x, scale, base, (out, out, out), rms_eps, hc_eps, 1, head=True)
    return out
