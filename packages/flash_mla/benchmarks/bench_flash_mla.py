"""flash_mla benchmark on V4-Flash shapes: sparse decode and prefill, Triton kernels against the reference.

    python packages/flash_mla/benchmarks/bench_flash_mla.py --out RESULT.json   # GPU, issue 5 shapes (~100 s)
    python packages/flash_mla/benchmarks/bench_flash_mla.py --out R.json --all-variants  # + ws / ws2 rows (~120 s)
    python packages/flash_mla/benchmarks/bench_flash_mla.py --smoke             # CPU, tiny shapes (interpreter)
    python packages/flash_mla/benchmarks/bench_flash_mla.py --table RESULT.json # README markdown table (all rows)
    python packages/flash_mla/benchmarks/bench_flash_mla.py --summary RESULT.json  # README key-shape table
    python packages/flash_mla/benchmarks/bench_flash_mla.py --opt-summary RESULT.json  # ws3p option builds (session 6)

Shapes: 64 heads, d = 512, softmax scale 512^-0.5, a per-head sink. Decode: b in {1, 2, 32, 64, 128, 256} x s_q in {1,
2, 4} (2 and 64 only at s_q = 2, FlashMLA's measured points), 640 indices per query token: the request's 128 window rows
plus 512 distinct random rows of its 16,384 compressed rows (CSA at 64K context), about 3 % of positions set to -1; HCA
at 1M context: 128 window + all 8,192 compressed rows of the request, b in {1, 32}. Wave diagnostic `decode_wave` b = 66
/ 132 x s_q = 2 (132 / 264 tokens: exactly 1 / 2 full waves of ws3's one-CTA-per-SM grid), rows `_WAVE_ROWS` only.
Prefill: 4,096 and 16,384 queries x 640 indices (128 window rows before the query + 512 random rows of t/4 compressed
rows), one cache, about 3 % holes. Engine calls (`engine_decode` b = 32 / 128, `engine_prefill` t = 4,096: the main list
into the BF16 pool plus `extra_kv` = the step's new rows, as model/attention.py calls it): `split` (the Triton kernel,
what the engine ran until the CUDA kernel took extra_kv) against `cuda` and `api` (the public call: the serial kernel)
and `cuda_ws3_extra` (ws3 with the extra cache, kernel="cuda_ws3"; prepared in session 5 round 4, off by default).

Implementations, timed in the same run: `api` / `api_fp8` (the public `sparse_attn_decode` / `sparse_attn_prefill` with
its default routing, BF16 / FP8 cache: since session 5 ws3 at >= 32 query tokens without an extra cache, else the serial
CUDA kernel; the record's `api_kernel` says which), `split` (triton_split_attn, BF16 cache), `split_fp8` (same kernel on
the 584-byte FP8 rows), `chunked` / `chunked_fp8` (triton_split_chunked: the tile in 64-dim chunks, FP8 scales per
chunk, FP8 rows in 64-row tiles x 2 stages; kernel="chunked"), `deferred` / `deferred_fp8` (triton_split_deferred: P @ V
one tile behind, scores not duplicated across warpgroups; kernel="deferred"), `cuda` / `cuda_fp8`
(csrc/cuda/fm_sparse_decode.cu, the compiled sm_90a wgmma kernel; kernel="cuda"; GPU runs only, an error record when _C
is not built), variants `<impl>_bn<rows>_st<stages>` (tile config) and `<impl>_s<n>` (split count), the CUDA kernel's
small-batch plans `cuda[_fp8]_<plan>_<merge>` (plan default / fine / auto, merge of the split partials pdl / last CTA;
plain `cuda` = the API's DEFAULT_OPTIONS) and `cuda_prefetch` (prefill: L2 prefetch of the token one wave ahead), the
warp-specialised kernel `cuda_ws3[_fp8]` (cuda_ws_decode.py variant ws3 = fm_ws3_decode.cu, 64-row tiles;
kernel="cuda_ws3"; with `--all-variants` also the settled session-4 variants `cuda_ws[_fp8]` / `cuda_ws2[_fp8]`; `_s<n>`
forced splits, ws3's own `cuda_ws3[_fp8]_s2` / `_s3` at b = 64 / 128 x s_q = 2 and b = 32 x s_q = 4; the
persistent ws3 `cuda_ws3p[_fp8]` (variant ws3p: min(#SMs, work items) CTAs looping over (token, split) items; session 5
round 5, GPU-run in s6) at every case where `cuda_ws3` runs, decode_wave included, its `x_vs_cuda_ws3_same_cache` =
the persistent grid's gain; ws3p's session-6 option builds `cuda_ws3pl` / `pe` / `px` / `p1` / `p1l` (BF16 and FP8)
and `cuda_ws3pw_fp8` (cuda_ws_decode.WS3P_OPTS: lazy O rescale, early next-tile scores, all three; one scoring
warpgroup, + lazy; wide FP8 producer batch; all but p1 / p1l bit-identical to ws3p; GPU-run in s6) at b = 32 /
128 / 256 x s_q = 2 and prefill t = 4,096 (`_WS3P_OPT_CASES`), `cuda_ws3px[_fp8]_l2hot` at b = 128 s_q = 2; at
b = 128 s_q = 2 and prefill t = 4,096 also the timing-only ablations `cuda_ws<v>_abl_<mode>[_fp8]`,
modes producer / consumer (all variants) and no_xchg / qk_only / pv_only / no_softmax (ws / ws2), WRONG numbers by
design: where the time goes), `legacy` (triton_sparse_attn, 32 heads per program, BF16), `reference` (gather + fp32
softmax, BF16 cache); "x split (same cache)" is the speed-up over `split` / `split_fp8` (the Triton kernel).
`split_s<n>` name no kernel: they run the API default (when _C is built: ws3 at >= 32 query tokens, i.e. the b = 32
rows, else the serial CUDA kernel).
TFLOPS = 2 * 64 * (valid indices) * (512 + 512) / time (the issue's formula);
bytes = q + out (bf16) + indices + one cache row per valid index (1,024 B BF16, 584 B FP8), as FlashMLA counts.
Timing: kernelkit.bench_cuda (CUDA events, 256 MiB L2 flush before every call).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

_PKG = pathlib.Path(__file__).resolve().parents[1]
for _p in (_PKG / "src", _PKG.parent / "kernelkit" / "src"):  # source tree first, as the root conftest does
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

H, D = 64, 512
SCALE = D**-0.5
HOLE_FRAC = 0.03
VARIANT_BUDGET_S = 75.0  # tuning variants start only within this many seconds of the run (whole run < 120 s)
# DeepSeek's FlashMLA (last Hopper release 9241ae3) on this H200, its own harness; /work/shared/reference/
# h200-ceilings.md: decode s_q = 2, 128 + 512 indices, FP8 cache; prefill BF16, 640 indices.
FLASHMLA_H200 = {
    ("decode", 2, 2, 640): (22.0, 15.2),
    ("decode", 64, 2, 640): (218.0, 49.3),
    ("decode", 128, 2, 640): (230.0, 93.2),
    ("decode", 256, 2, 640): (243.0, 176.6),
    ("prefill", 4096, 1, 640): (492.0, None),
    ("prefill", 16384, 1, 640): (509.0, None),
}


def _log(msg: str) -> None:
    print(msg, flush=True)


def _holes(idx: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    drop = torch.rand(idx.shape, generator=g, device=idx.device) < HOLE_FRAC
    return torch.where(drop, torch.full_like(idx, -1), idx)


def decode_indices(b: int, s_q: int, n_comp: int, k_comp: int, win: int, region: int, g: torch.Generator):
    """int32 [b, s_q, win + k_comp]: request r owns slots [r * region, (r + 1) * region): its `win` window rows
    first, then `n_comp` compressed rows; each query token names the whole window and k_comp random distinct
    compressed rows (all of them when k_comp == n_comp, HCA), in random order, ~3 % holes."""
    dev = g.device
    base = (torch.arange(b, device=dev) * region).view(b, 1, 1)
    window = torch.arange(win, device=dev).view(1, 1, win).expand(b, s_q, win)
    if k_comp == n_comp:
        comp = torch.arange(n_comp, device=dev).view(1, 1, -1).expand(b, s_q, n_comp)
    else:
        comp = torch.rand(b, s_q, n_comp, generator=g, device=dev).topk(k_comp, dim=-1).indices
    idx = torch.cat([window, win + comp], dim=-1) + base
    perm = torch.rand(idx.shape, generator=g, device=dev).argsort(dim=-1)
    return _holes(torch.gather(idx, -1, perm).to(torch.int32), g)


def prefill_indices(t: int, k_comp: int, win: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """int32 [t, win + k_comp] into one cache of win + max(k_comp, t // 4) rows (window rows first), ~3 % holes."""
    dev = g.device
    n_comp = max(k_comp, t // 4)
    window = torch.arange(win, device=dev).view(1, win).expand(t, win)
    comp = torch.rand(t, n_comp, generator=g, device=dev).topk(k_comp, dim=-1).indices + win
    return _holes(torch.cat([window, comp], dim=-1).to(torch.int32), g), win + n_comp


def _api_fn(op: str, b: int, s_q: int, cache: torch.Tensor | None = None, extra: tuple | None = None):
    """fn(q3, cache_bf16, idx2, sink) -> (out [t, H, D], lse [t, H]) through the public API, as a caller runs it:
    `sparse_attn_decode` on [b, s_q, ...] views for decode ops, `sparse_attn_prefill` otherwise (engine calls: with
    extra = (extra_kv, extra_indices)); `cache` replaces the BF16 cache (the FP8 rows for `api_fp8`)."""
    from deepinfer.flash_mla import api

    if op.startswith("decode"):

        def fn(q, c, i, s):  # noqa: ANN001, ANN202
            o, lse = api.sparse_attn_decode(q.view(b, s_q, H, D), c if cache is None else cache,
                                            i.view(b, s_q, -1), s, SCALE)  # fmt: skip
            return o.view(-1, H, D), lse.view(-1, H)

        return fn
    kw = dict(extra_kv=extra[0], extra_indices=extra[1]) if extra else {}
    return lambda q, c, i, s: api.sparse_attn_prefill(q, c if cache is None else cache, i, s, SCALE, **kw)


def _api_kernel(q: torch.Tensor, cache: torch.Tensor, extra: tuple | None) -> str:
    """What the API default ran for this call (`_dispatch.kernel_for`), recorded with the `api` rows."""
    from deepinfer.flash_mla import _dispatch

    return _dispatch.kernel_for(q, cache, extra[0] if extra else None)


def _impls(
    fp8_cache: torch.Tensor | None, legacy: bool, reference: bool, variants: list[tuple[str, dict]], cuda: bool = False,
    api_case: tuple[str, int, int] | None = None,
):  # fmt: skip
    """name -> fn(q3, cache_bf16, idx2, sink) returning (out, lse). cuda: add the compiled sm_90a kernel (`cuda`,
    `cuda_fp8`; without a built _C their calls raise and the case records the error). api_case: (op, b, s_q) adds
    `api` / `api_fp8`, the public function with its default routing."""
    from deepinfer.flash_mla import reference as ref
    from deepinfer.flash_mla.backends.cuda import triton_sparse_attn as old
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as new

    fns = {}
    if api_case is not None:  # the default, first: every other row of the case is measured against it
        fns["api"] = _api_fn(*api_case)
        if fp8_cache is not None:
            fns["api_fp8"] = _api_fn(*api_case, cache=fp8_cache)
    # "split" / "split_fp8" pin the Triton "fused" kernel (the default before the CUDA kernel), so "x split" keeps
    # meaning "x the Triton kernel" now that DEFAULT_KERNELS is "cuda"
    fns["split"] = lambda q, c, i, s: new.sparse_attn_split_triton(q, c, i, s, SCALE, kernel="fused")
    fns["chunked"] = lambda q, c, i, s: new.sparse_attn_split_triton(q, c, i, s, SCALE, kernel="chunked")
    fns["deferred"] = lambda q, c, i, s: new.sparse_attn_split_triton(q, c, i, s, SCALE, kernel="deferred")
    if fp8_cache is not None:
        fns["split_fp8"] = lambda q, c, i, s: new.sparse_attn_split_triton(q, fp8_cache, i, s, SCALE, kernel="fused")
        fns["chunked_fp8"] = lambda q, c, i, s: new.sparse_attn_split_triton(
            q, fp8_cache, i, s, SCALE, kernel="chunked"
        )
        fns["deferred_fp8"] = lambda q, c, i, s: new.sparse_attn_split_triton(
            q, fp8_cache, i, s, SCALE, kernel="deferred"
        )
    if cuda:  # kernel="cuda": the serial kernel, whatever the default routes to
        fns["cuda"] = lambda q, c, i, s: new.sparse_attn_split_triton(q, c, i, s, SCALE, kernel="cuda")
        if fp8_cache is not None:
            fns["cuda_fp8"] = lambda q, c, i, s: new.sparse_attn_split_triton(q, fp8_cache, i, s, SCALE, kernel="cuda")
    if legacy:
        fns["legacy"] = lambda q, c, i, s: old.sparse_attn_triton(q, c, i, s, SCALE)
    for name, kw in variants:  # a name with "fp8" runs on the FP8 cache
        if "fp8" in name and fp8_cache is None:
            continue
        fns[name] = lambda q, c, i, s, kw=kw, f=("fp8" in name): new.sparse_attn_split_triton(
            q, fp8_cache if f else c, i, s, SCALE, **kw
        )
    if reference:
        fns["reference"] = lambda q, c, i, s: ref.sparse_attn(q, c, i, s, SCALE)
    bad = _cuda_probe_error() if cuda else None
    if bad is not None:  # never launch a kernel that faulted / hung in the probe: it would end this process's CUDA
        for name in [n for n in fns if n.startswith("cuda") or n.startswith("api")]:
            fns[name] = lambda q, c, i, s, why=bad: _raise(why)
    return fns


def _raise(why: str):  # noqa: ANN202
    raise RuntimeError(why)


def _ws_impls(
    fp8_cache: torch.Tensor | None, splits: tuple[int, ...], ablated: tuple[str, ...], variants: tuple[str, ...],
    ws3_splits: tuple[int, ...] = (),
) -> dict:  # fmt: skip
    """`cuda_ws3` / `cuda_ws3_fp8` (and, in `variants`, `cuda_ws` / `cuda_ws2`[_fp8]): the warp-specialised kernel's
    variants (cuda_ws_decode.py; csrc/cuda/fm_ws_decode.cu, fm_ws3_decode.cu) with the serial kernel's split plan,
    next to `cuda` / `cuda_fp8`, plus `cuda_ws<v>[_fp8]_s<n>` forced split counts (`splits` in 32-row tiles for every
    variant; `ws3_splits` in ws3's own 64-row tiles, ws3 only) and, for the variants in `ablated`, their timing-only
    modes `cuda_ws<v>_abl_<mode>[_fp8]` (wrong numbers by design: where the time goes).
    Raisers when a probe failed (a fault would end this process's CUDA context); without _C.sparse_decode_ws every
    call records the wrapper's ValueError."""
    from deepinfer.flash_mla.backends.cuda import cuda_ws_decode as ws

    fns, probe_of = {}, {}
    for variant in [v for v in ws.VARIANTS if v in variants]:
        modes = [m for m in ws.ablations_of(variant) if m != "full"] if variant in ablated else []
        # forced counts in 32-row tiles; ws3 (64-row tiles) gets the counts with the same rows per split
        v_splits = [n * ws.KERNEL_ROWS // ws.block_rows(variant) for n in splits]
        v_splits += [n for n in ws3_splits if variant == "ws3" and n not in v_splits]
        for n, mode in [(None, "full")] + [(n, "full") for n in v_splits] + [(None, m) for m in modes]:
            base = f"cuda_{variant}" + (f"_s{n}" if n else "") + ("" if mode == "full" else f"_abl_{mode}")
            kw = dict(num_splits=n, variant=variant, ablation=mode)
            if variant not in _FP8_ONLY:  # ws3pw on a BF16 cache is ws3p's kernel itself: no row
                fns[base] = lambda q, c, i, s, kw=kw: ws.sparse_attn_ws(q, c, i, s, SCALE, **kw)
            if fp8_cache is not None:
                fns[f"{base}_fp8"] = lambda q, c, i, s, kw=kw: ws.sparse_attn_ws(q, fp8_cache, i, s, SCALE, **kw)
            # the ws3p option builds share one probe child (all four checked there)
            key = ",".join(ws.WS3P_OPT_VARIANTS) if variant in ws.WS3P_OPT_VARIANTS else variant
            probe_of.update({base: key, f"{base}_fp8": key} if mode == "full" else
                            {base: "ablations", f"{base}_fp8": "ablations"})  # fmt: skip
    for key in sorted(set(probe_of.values())):
        if key not in _PROBE:
            if not ws.available():
                ok, out = True, ""
            elif key == "ablations":
                ok, out = ws.probe_ablations(timeout_s=60.0)
            else:
                ok, out = ws.probe(timeout_s=60.0, variant=key)  # a hang costs <= 60 s of the run
            _PROBE[key] = None if ok else f"warp-specialised kernel probe ({key}) failed: {out[-400:]}"
            _log(f"cuda_ws kernel {key}: available={ws.available()} probe={_PROBE[key] or 'ok or n/a'}")
    bad = {k: _PROBE[probe_of[k]] for k in fns}  # (a probe key with no row left, e.g. ws3pw's BF16 one, is unused)
    return {k: (lambda q, c, i, s, why=bad[k]: _raise(why)) if bad[k] else fn for k, fn in fns.items()}


def _ws_splits(op: str, b: int, s_q: int) -> tuple[int, ...]:
    """Forced split counts of the warp-specialised kernel (32-row tiles: up to 20 splits at 640 indices; ws3 runs half
    as many splits of 64-row tiles: the same rows per split)."""
    if (op, b, s_q) in (("decode", 2, 2), ("decode", 1, 1)):
        return (10, 20)
    return (130, 260) if (op, b, s_q) == ("decode_hca1m", 1, 1) else ()


def _ws3_splits(op: str, b: int, s_q: int) -> tuple[int, ...]:
    """ws3's forced split counts (its 64-row tiles; rows `cuda_ws3[_fp8]_s<n>`) where the default plan runs one split
    per token in one or two waves of CTAs (128 / 256 tokens on 132 SMs): does splitting help ws3 there? (Session 5,
    round 2; the default plan is 1 split at all three.)"""
    return (2, 3) if (op, b, s_q) in (("decode", 64, 2), ("decode", 128, 2), ("decode", 32, 4)) else ()


# Wave diagnostic (session 5, round 2): b = 66 / 132 x s_q = 2 = 132 / 264 query tokens = exactly 1 / 2 full waves of
# ws3's one-CTA-per-SM grid (1 split), against b = 64 / 128 x s_q = 2 (128 / 256 tokens: 4 / 8 SMs idle in the last
# wave). Same time for 3 % more tokens = the wave quantisation (session 5 run r3: ~3 %).
# Only these rows run there (no Triton / legacy / tuning rows: < 1 s per case).
_WAVE_ROWS = ("cuda", "cuda_fp8", "cuda_ws3", "cuda_ws3_fp8", "cuda_ws3p", "cuda_ws3p_fp8", "reference")

_PROBE: dict[str, str | None] = {}

# ws3p option builds (session 6; cuda_ws_decode.WS3P_OPTS, each bit-identical to ws3p): rows `cuda_<variant>[_fp8]` next
# to `cuda_ws3` / `cuda_ws3p` at these cases only (b = 32 / 128 / 256 x s_q = 2 and prefill t = 4,096: BF16 and FP8).
_WS3P_OPT_CASES = (("decode", 32, 2), ("decode", 128, 2), ("decode", 256, 2), ("prefill", 4096, 1))
_FP8_ONLY = ("ws3pw",)  # only changes the FP8 producer (on a BF16 cache it runs ws3p's kernel)


def _cuda_probe_error() -> str | None:
    """None when the compiled kernel passed its out-of-process probe (or is not built: its calls then raise a
    clear error by themselves), else why not (once per run)."""
    if "err" not in _PROBE:
        from deepinfer.flash_mla.backends.cuda import cuda_sparse_decode as cu

        err = None
        if cu.available():
            ok, out = cu.probe()
            err = None if ok else f"CUDA kernel probe failed: {out[-400:]}"
        _PROBE["err"] = err
        _log(f"cuda kernel: available={cu.available()} probe={'failed: ' + err if err else 'ok or n/a'}")
    return _PROBE["err"]


def _variants(op: str, b: int, s_q: int, smoke: bool) -> list[tuple[str, dict]]:
    """Other tile shapes / split counts of the split kernel on a few shapes (tuning data for the next change)."""
    tiles = [  # defaults: fused BF16 (H, 64, 8, 2), FP8 (H, 32, 8, 3); chunked the same but FP8 (H, 64, 8, 2);
        # deferred (H, 32, 8, 3)
        ("chunked_fp8_bn32_st3", dict(config=(H, 32, 8, 3), kernel="chunked")),
        ("split_fp8_bn64_st2", dict(config=(H, 64, 8, 2))),
        ("chunked_fp8_bn64_st3", dict(config=(H, 64, 8, 3), kernel="chunked")),
        ("deferred_fp8_bn32_st2", dict(config=(H, 32, 8, 2), kernel="deferred")),
        ("deferred_fp8_bn16_st4", dict(config=(H, 16, 8, 4), kernel="deferred")),
        ("deferred_bn16_st4", dict(config=(H, 16, 8, 4), kernel="deferred")),
    ]
    if smoke:
        return (
            [("deferred_fp8_bn16", dict(config=(H, 16, 4, 1), kernel="deferred"))] if (op, b) == ("decode", 1) else []
        )
    if (op, b, s_q) in (("decode", 128, 2), ("prefill", 4096, 1)):
        return tiles
    if (op, b, s_q) == ("decode", 2, 2):  # FlashMLA's 15.2 us point: one 32-row tile per split (80 programs)
        return [(f"{k}_fp8_s20", dict(num_splits=20, kernel=k if k != "split" else "fused")) for k in
                ("split", "chunked", "deferred")] + _cuda_splits(10)  # fmt: skip
    if (op, b, s_q) == ("decode_hca1m", 1, 1):  # auto: 130 splits of 2 tiles
        return [("split_s33", dict(num_splits=33)), ("split_s65", dict(num_splits=65))] + _cuda_splits(130)
    if (op, s_q) == ("decode", 1) and b in (1, 32):  # auto: 10 splits at b = 1, 4 at b = 32
        return [(f"split_s{n}", dict(num_splits=n)) for n in ((5, 20) if b == 1 else (1, 2, 8))] + (
            _cuda_splits(10) if b == 1 else [])  # fmt: skip
    return []


def _cuda_splits(n: int) -> list[tuple[str, dict]]:
    """The CUDA kernel (64-row tiles, DEFAULT_OPTIONS merge) with n splits per token."""
    return [(f"cuda_s{n}", dict(kernel="cuda", num_splits=n)), (f"cuda_fp8_s{n}", dict(kernel="cuda", num_splits=n))]


def _cuda_plan_variants(op: str, b: int, s_q: int) -> list[tuple[str, dict]]:
    """The CUDA kernel's small-batch plans (cuda_sparse_decode PLANS x MERGES) where the default plan splits: they
    decide DEFAULT_OPTIONS (rows `cuda[_fp8]_<plan>_<merge>` against `cuda[_fp8]`)."""
    if op == "prefill" or (op, b, s_q) == ("decode", 256, 4):  # several waves of CTAs: the L2 prefetch
        return [("cuda_prefetch", dict(kernel="cuda", cuda_prefetch=True))]
    if (op, s_q) not in (("decode", 1), ("decode", 2), ("decode_hca1m", 1)) or b > 2:
        return []
    out = []
    for plan, merge in (("default", "pdl"), ("default", "last_cta"), ("fine", "triton"), ("fine", "pdl"),
                        ("fine", "last_cta"), ("auto", "pdl")):  # fmt: skip
        for f in ("", "_fp8"):
            name = f"cuda{f}_{plan}_{merge.replace('_cta', '')}"
            out.append((name, dict(kernel="cuda", cuda_plan=plan, cuda_merge=merge)))
    return out


def _extra_impls(extra_kv: torch.Tensor, extra_idx: torch.Tensor, reference: bool, api_fn=None) -> dict:  # noqa: ANN001
    """The engine's call: main list into the pool plus extra_kv / extra_indices; `api` (the public function, as the
    engine calls it: the serial kernel), Triton (`split`), `cuda` and `cuda_ws3_extra` (ws3 with the extra cache,
    kernel="cuda_ws3": session 5 round 4, off by default; DEEPINFER_FLASH_MLA_WS3_EXTRA=1 would route the engine
    there)."""
    from deepinfer.flash_mla import reference as ref
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as new

    kw = dict(extra_kv=extra_kv, extra_indices=extra_idx)
    fns = {"api": api_fn} if api_fn is not None else {}
    kernels = (("split", "fused"), ("cuda", "cuda"), ("cuda_ws3_extra", "cuda_ws3"))
    fns.update({name: (lambda q, c, i, s, k=kernel: new.sparse_attn_split_triton(q, c, i, s, SCALE, kernel=k, **kw))
                for name, kernel in kernels})  # fmt: skip
    if reference:
        fns["reference"] = lambda q, c, i, s: ref.sparse_attn(q, c, i, s, SCALE, extra_kv, extra_idx)
    bad = _cuda_probe_error()
    if bad is not None:
        for name in ("api", "cuda", "cuda_ws3_extra"):
            if name in fns:
                fns[name] = lambda q, c, i, s, why=bad: _raise(why)
    bad_ws3 = _ws3_extra_probe_error()
    if bad_ws3 is not None:
        fns["cuda_ws3_extra"] = lambda q, c, i, s, why=bad_ws3: _raise(why)
    return fns


def _ws3_extra_probe_error() -> str | None:
    """None when ws3 with the extra cache passed its out-of-process probe (or `_C` lacks it: the call then raises a
    clear error by itself), else why not (once per run; a fault would end this process's CUDA context)."""
    if "ws3_extra" not in _PROBE:
        from deepinfer.flash_mla.backends.cuda import cuda_ws_decode as ws

        err = None
        if ws.ws3_extra_available():
            ok, out = ws.probe_extra(timeout_s=60.0)
            err = None if ok else f"ws3 extra-cache probe failed: {out[-400:]}"
        _PROBE["ws3_extra"] = err
        _log(f"cuda_ws3_extra: available={ws.ws3_extra_available()} probe={err or 'ok or n/a'}")
    return _PROBE["ws3_extra"]


def run_case(
    op: str, b: int, s_q: int, idx: torch.Tensor, cache: torch.Tensor, fp8: torch.Tensor | None, cfg,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
):  # fmt: skip
    """Time every implementation on one shape; returns one record per implementation. extra: (extra_kv [t, D],
    extra_indices [t, k2]) for the engine's call (then only `split`, `cuda` and `reference` run)."""
    import kernelkit as kk

    t, k = idx.shape[0] * (idx.shape[1] if idx.dim() == 3 else 1), idx.shape[-1]
    idx2 = idx.reshape(t, k)
    g = torch.Generator(device=cache.device).manual_seed(t * 7 + k)
    q = torch.randn(t, H, D, generator=g, device=cache.device).bfloat16()
    sink = torch.randn(H, generator=g, device=cache.device)
    valid = int((idx2 >= 0).sum()) + (int((extra[1] >= 0).sum()) if extra else 0)  # host reads, not timed
    flops = 2 * H * valid * (D + D)
    fixed = 2 * t * H * D * 2 + idx2.numel() * 4 + (extra[1].numel() * 4 if extra else 0)
    extra_impls = _extra_impls(*extra, cfg["reference"], api_fn=_api_fn(op, b, s_q, extra=extra)) if extra else None
    shape = f"b={b} s_q={s_q} k={k}" if not op.endswith("prefill") else f"t={t} k={k}"
    shape += f"+{extra[1].shape[1]}" if extra else ""
    recs, ref_out = [], None
    # Past the variant deadline (compiles are most of the GPU run's 120 s) only the main implementations run.
    variants = _variants(op, b, s_q, cfg["smoke"]) if time.time() < cfg["variant_deadline"] else []
    variants += [] if cfg["smoke"] else _cuda_plan_variants(op, b, s_q)  # no compiles: always
    impls = extra_impls or _impls(fp8, cfg["legacy"], cfg["reference"], variants, cuda=not cfg["smoke"],
                                  api_case=(op, b, s_q))  # fmt: skip
    if extra is None and not cfg["smoke"]:  # the warp-specialised kernel next to `cuda` / `cuda_fp8`
        # ws3 always; ws / ws2 (settled in sessions 4-5: slower than ws3 at every shape) only with --all-variants.
        # The ablation rows (where the time goes): every variant run at b = 128 s_q = 2; at prefill t = 4,096 only
        # ws3 (ws / ws2's prefill ablations were measured in session 4)
        # ws3p (persistent ws3, session 5 round 5, GPU-run in s6): next to ws3 at every case where ws3 runs
        ws_vars = ("ws", "ws2", "ws3", "ws3p") if cfg.get("all_variants") else ("ws3", "ws3p")
        if (op, b, s_q) in _WS3P_OPT_CASES:  # session 6: ws3p's option builds, side by side with ws3 / ws3p
            ws_vars += ("ws3pw", "ws3pl", "ws3pe", "ws3px", "ws3p1", "ws3p1l")
        abl = {("decode", 128, 2): ws_vars, ("prefill", 4096, 1): ("ws3",)}.get((op, b, s_q), ())
        impls.update(_ws_impls(fp8, _ws_splits(op, b, s_q) if variants else (), abl, ws_vars, _ws3_splits(op, b, s_q)))
    if op == "decode_wave":
        impls = {name: fn for name, fn in impls.items() if name in _WAVE_ROWS}
    if variants and ((op, b, s_q) == ("decode", 128, 2) or (cfg["smoke"] and op == "decode")):
        impls.update(_l2_hot(impls, idx2))
    for name, fn in impls.items():
        rec = {"op": op, "shape": shape, "impl": name, "b": b, "s_q": s_q, "t": t, "topk": k, "valid": valid}
        try:
            slow = name == "reference"
            st = kk.bench_cuda(
                lambda fn=fn: fn(q, cache, idx2, sink),
                warmup=1 if slow else cfg["warmup"],
                rep=cfg["rep_ref"] if slow else cfg["rep"],
            )
            us = st["median_us"]
            row_bytes = 584 if "fp8" in name else 2 * D
            out, _ = fn(q, cache, idx2, sink)
            if ref_out is None and name == "reference":
                ref_out = out
            rec.update(median_us=us, p10=st["p10"], p90=st["p90"], tflops=kk.tflops(flops, us))
            rec["gbps"] = kk.gbps(fixed + valid * row_bytes, us)
            rec["pct_bf16_tflops"] = kk.pct_of(rec["tflops"], kk.H200_CEILINGS["bf16_tflops"])
            rec["pct_hbm_copy"] = kk.pct_of(rec["gbps"], kk.H200_CEILINGS["hbm_copy_gbps"])
            rec["_out"] = out
            if name.startswith("api"):
                rec["api_kernel"] = _api_kernel(q, fp8 if name == "api_fp8" else cache, extra)
        except Exception as exc:  # record and go on: one failing case must not lose the others
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        recs.append(rec)
        _log(f"  {op} {shape} {name}: {_summary(rec)}")
    _finish_case(recs, ref_out, (op, b if not op.endswith("prefill") else t, s_q if op != "prefill" else 1, k))
    return recs


# the ws3 producer-only ablations too: with every row in L2, does the FP8 producer (88.8 us at b = 128 s_q = 2 in
# session 5, BF16 66.8) get faster (latency-bound: prefetch further) or not (bound by its own instructions)?
_L2HOT = ("split", "split_fp8", "chunked_fp8", "cuda", "cuda_fp8", "cuda_ws", "cuda_ws_fp8", "cuda_ws2", "cuda_ws2_fp8",
          "cuda_ws3", "cuda_ws3_fp8", "cuda_ws3_abl_producer", "cuda_ws3_abl_producer_fp8",
          "cuda_ws3p", "cuda_ws3p_fp8", "cuda_ws3px", "cuda_ws3px_fp8")  # fmt: skip


def _l2_hot(impls: dict, idx2: torch.Tensor) -> dict:
    """Diagnostic `<impl>_l2hot`: the same calls with every index folded into the first 1,024 slots (1 MiB of
    BF16 rows, L2-resident after the first touch; holes kept, so the FLOPs are the same). Close to the normal
    time: the kernel is bound by its own latency / compute, not HBM; much faster: by the gather."""
    hot = torch.where(idx2 >= 0, idx2 % 1024, idx2)
    names = [n for n in _L2HOT if n in impls]
    return {f"{n}_l2hot": (lambda q, c, i, s, f=impls[n]: f(q, c, hot, s)) for n in names}


def _summary(rec: dict) -> str:
    if "error" in rec:
        return rec["error"]
    return f"{rec['median_us']:.1f} us {rec['tflops']:.1f} TFLOPS {rec['gbps']:.0f} GB/s"


def _finish_case(recs: list[dict], ref_out: torch.Tensor | None, key: tuple) -> None:
    """Speed-ups vs every baseline of the same case, error vs the reference, FlashMLA's H200 numbers."""
    times = {r["impl"]: r["median_us"] for r in recs if "median_us" in r}
    fm = FLASHMLA_H200.get(key)
    for r in recs:
        out = r.pop("_out", None)
        if "median_us" not in r:
            continue
        for base in ("reference", "legacy", "split", "split_fp8"):
            if base in times and base != r["impl"]:
                r[f"x_vs_{base}"] = times[base] / r["median_us"]
        same = "split_fp8" if "fp8" in r["impl"] else "split"  # the Triton kernel on the same cache format
        if same in times and same != r["impl"]:
            r["x_vs_default_same_cache"] = times[same] / r["median_us"]
        cu = "cuda_fp8" if "fp8" in r["impl"] else "cuda"  # the serial CUDA kernel, same cache
        compiled = r["impl"].startswith("cuda") or r["impl"].startswith("api")
        if compiled and cu in times and cu != r["impl"]:
            r["x_vs_cuda_same_cache"] = times[cu] / r["median_us"]
        w3 = "cuda_ws3_fp8" if "fp8" in r["impl"] else "cuda_ws3"  # the warp-specialised ws3 kernel, same cache
        if compiled and w3 in times and w3 != r["impl"]:
            r["x_vs_cuda_ws3_same_cache"] = times[w3] / r["median_us"]
        if out is not None and ref_out is not None and r["impl"] != "reference" and "l2hot" not in r["impl"]:
            r["max_abs_err_vs_ref"] = float((out.float() - ref_out.float()).abs().max())
        if fm is not None:
            r["flashmla_h200_tflops"], r["flashmla_h200_us"] = fm
            r["x_vs_flashmla"] = r["tflops"] / fm[0]


def _cases(smoke: bool):
    """(op, b, s_q, n_comp, k_comp, win) decode cases and (t, k_comp, win) prefill cases."""
    if smoke:
        return [("decode", 1, 2, 48, 24, 8), ("decode", 3, 1, 16, 16, 8)], [(8, 24, 8)]
    dec = [("decode", b, s, 16384, 512, 128) for b in (1, 32, 128, 256) for s in (1, 2, 4)]
    dec += [("decode", 2, 2, 16384, 512, 128), ("decode", 64, 2, 16384, 512, 128)]
    dec += [("decode_hca1m", b, s, 8192, 8192, 128) for b in (1, 32) for s in (1, 2)]
    dec += [("decode_wave", b, 2, 16384, 512, 128) for b in (66, 132)]  # full waves (`_WAVE_ROWS`)
    return dec, [(4096, 512, 128), (16384, 512, 128)]


def run(smoke: bool, out_path: str | None, all_variants: bool = False) -> list[dict]:
    import kernelkit as kk
    from deepinfer.flash_mla import api

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(warmup=1, rep=2, rep_ref=2, legacy=True, reference=True, smoke=smoke) if smoke else dict(
        warmup=3, rep=20, rep_ref=3, legacy=True, reference=True, smoke=smoke)  # fmt: skip
    cfg["all_variants"] = all_variants
    g = torch.Generator(device=dev).manual_seed(0)
    dec, pre = _cases(smoke)
    region = max(c[3] + c[5] for c in dec)
    b_max = max(c[1] for c in dec)
    t0 = time.time()
    cfg["variant_deadline"] = t0 + VARIANT_BUDGET_S
    cache = torch.randn(b_max * region, D, generator=g, device=dev).bfloat16()
    fp8 = api.pack_fp8_kv(cache)
    _log(f"caches: {b_max} x {region} rows ({cache.numel() * 2 / 1e9:.2f} GB bf16) in {time.time() - t0:.1f} s")
    records: list[dict] = []
    meta = {"package": "flash_mla", "smoke": smoke, "heads": H, "d": D, "hole_frac": HOLE_FRAC,
            "all_variants": all_variants}  # fmt: skip
    for op, b, s_q, n_comp, k_comp, win in dec:
        idx = decode_indices(b, s_q, n_comp, k_comp, win, region, g)
        cfg["legacy"] = op == "decode"
        records += run_case(op, b, s_q, idx, cache, fp8, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    if not smoke:
        records += _engine_cases(cache, region, g, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    del fp8, cache
    for t, k_comp, win in pre:
        idx, rows = prefill_indices(t, k_comp, win, g)
        pcache = torch.randn(rows, D, generator=g, device=dev).bfloat16()
        cfg["legacy"] = True
        records += run_case("prefill", t, 1, idx, pcache, None, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    _log(f"done in {time.time() - t0:.1f} s")
    return records


def _engine_cases(cache: torch.Tensor, region: int, g: torch.Generator, cfg: dict) -> list[dict]:
    """The engine's calls (model/attention.py): decode b = 32 / 128 (640 main indices + 128 window slots of the
    step's new rows, one valid: the token's own) and a fresh 4,096-token prompt (no ring rows: the main list's 128
    window slots are -1; 128 new-row window slots; 512 compressed rows)."""
    recs, cfg = [], dict(cfg, legacy=False)
    for b in (32, 128):
        idx = decode_indices(b, 1, 16384, 512, 128, region, g).view(b, -1)
        new_kv = torch.randn(b, D, generator=g, device=cache.device).bfloat16()
        win = torch.full((b, 128), -1, dtype=torch.int32, device=cache.device)
        win[:, -1] = torch.arange(b, dtype=torch.int32, device=cache.device)
        recs += run_case("engine_decode", b, 1, idx, cache, None, cfg, extra=(new_kv, win))
    t = 4096
    idx, _ = prefill_indices(t, 512, 128, g)
    idx[:, :128] = -1  # fresh prompt: nothing in the ring
    new_kv = torch.randn(t, D, generator=g, device=cache.device).bfloat16()
    kpos = torch.arange(t, device=cache.device)[:, None] - 127 + torch.arange(128, device=cache.device)[None, :]
    win = torch.where(kpos >= 0, kpos, -1).to(torch.int32)
    recs += run_case("engine_prefill", t, 1, idx, cache, None, dict(cfg, reference=False), extra=(new_kv, win))
    return recs


def table(path: str) -> str:
    """Markdown table of a saved result file (README's Benchmarks section)."""
    recs = json.loads(pathlib.Path(path).read_text())["records"]
    lines = [
        "| op | shape | impl | time (us) | TFLOPS | GB/s | % bf16 peak | % HBM copy | x reference | x legacy "
        "| x split (same cache) | FlashMLA H200 TFLOPS (us) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['shape']} | {r['impl']} | error: {r['error'][:60]} | | | | | | | | |")
            continue
        fm = r.get("flashmla_h200_tflops")
        fm_s = f"{fm:.0f} ({r['flashmla_h200_us']})" if fm is not None and r.get("flashmla_h200_us") else (
            f"{fm:.0f}" if fm is not None else "")  # fmt: skip
        xr, xl, xs = r.get("x_vs_reference"), r.get("x_vs_legacy"), r.get("x_vs_default_same_cache")
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['impl']} | {r['median_us']:.1f} | {r['tflops']:.1f} | {r['gbps']:.0f} "
            f"| {r['pct_bf16_tflops']:.0f} | {r['pct_hbm_copy']:.0f} | {f'{xr:.1f}' if xr else ''} "
            f"| {f'{xl:.2f}' if xl else ''} | {f'{xs:.2f}' if xs else ''} | {fm_s} |"
        )
    return "\n".join(lines)


_SUMMARY = ("cuda", "cuda_ws3", "cuda_fp8", "cuda_ws3_fp8", "api", "api_fp8")


def _cell(r: dict | None, hca: bool) -> str:
    """ "us (TFLOPS)" of a record ("us (GB/s)" at HCA; "error" / "" when it failed / is absent)."""
    if r is None:
        return ""
    if "error" in r:
        return "error"
    rate = f"{r['gbps']:.0f} GB/s" if hca else f"{r['tflops']:.1f}"
    return f"{r['median_us']:.1f} ({rate})"


def _ratio(rows: dict, num: str, den: str) -> str:
    a, b = rows.get(num), rows.get(den)
    if not a or not b or "median_us" not in a or "median_us" not in b:
        return ""
    return f"{a['median_us'] / b['median_us']:.2f}"


def summary(path: str) -> str:
    """README key-shape table of a saved result: per case (decode, HCA, engine, prefill) the serial kernel (`cuda`)
    against ws3 (`cuda_ws3`) on both caches, time in us (TFLOPS; HCA: GB/s), "ws3 x" = cuda time / ws3 time, the API
    default (`api` rows with the kernel it ran, when the run has them), the persistent ws3 (`cuda_ws3p[_fp8]`, "ws3p x"
    = ws3 time / ws3p time, when the run has them) and FlashMLA's published H200 numbers."""
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in json.loads(pathlib.Path(path).read_text())["records"]:
        by.setdefault((r["op"], r["shape"]), {})[r["impl"]] = r
    has_api = any("api" in rows for rows in by.values())
    head = ["op", "shape", "`cuda` BF16", "`cuda_ws3` BF16", "ws3 x", "`cuda_fp8`", "`cuda_ws3_fp8`", "ws3 x FP8"]
    head += ["`api` BF16 (kernel)", "`api_fp8` (kernel)"] if has_api else []
    has_p = any("cuda_ws3p" in rows or "cuda_ws3p_fp8" in rows for rows in by.values())
    head += ["`cuda_ws3p` BF16", "ws3p x", "`cuda_ws3p_fp8`", "ws3p x FP8"] if has_p else []
    lines = ["| " + " | ".join([*head, "FlashMLA H200 TFLOPS (us)"]) + " |", "|" + "---|" * (len(head) + 1)]
    rank = {"decode": 0, "decode_wave": 1, "decode_hca1m": 2, "engine_decode": 3, "engine_prefill": 4, "prefill": 5}

    def order(key: tuple[str, str]) -> tuple:
        r = next(iter(by[key].values()))
        return rank.get(r["op"], 6), r["b"], r["s_q"]

    for op, shape in sorted(by, key=order):
        rows = by[(op, shape)]
        if not any(n in rows for n in _SUMMARY):
            continue
        hca = op == "decode_hca1m"
        cells = [op, shape, _cell(rows.get("cuda"), hca), _cell(rows.get("cuda_ws3"), hca),
                 _ratio(rows, "cuda", "cuda_ws3"), _cell(rows.get("cuda_fp8"), hca),
                 _cell(rows.get("cuda_ws3_fp8"), hca), _ratio(rows, "cuda_fp8", "cuda_ws3_fp8")]  # fmt: skip
        if has_api:
            for n in ("api", "api_fp8"):
                r = rows.get(n)
                cells.append(_cell(r, hca) + (f" {r['api_kernel']}" if r and "api_kernel" in r else ""))
        if has_p:
            cells += [_cell(rows.get("cuda_ws3p"), hca), _ratio(rows, "cuda_ws3", "cuda_ws3p")]
            cells += [_cell(rows.get("cuda_ws3p_fp8"), hca), _ratio(rows, "cuda_ws3_fp8", "cuda_ws3p_fp8")]
        fm = next((r for r in rows.values() if r.get("flashmla_h200_tflops")), None)
        us = fm.get("flashmla_h200_us") if fm else None
        cells.append(f"{fm['flashmla_h200_tflops']:.0f}" + (f" ({us})" if us else "") if fm else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_OPT_ROWS = ("ws3p", "ws3pw", "ws3pl", "ws3pe", "ws3px", "ws3p1", "ws3p1l")  # ws3p and its session-6 option builds


def opt_summary(path: str) -> str:
    """Session-6 table of a saved result: at each `_WS3P_OPT_CASES` case and cache, ws3 / ws3p and ws3p's option builds
    (time in us (TFLOPS), then "x ws3p" = ws3p time / this time: > 1 is faster than ws3p), L2-hot rows included."""
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in json.loads(pathlib.Path(path).read_text())["records"]:
        by.setdefault((r["op"], r["shape"]), {})[r["impl"]] = r
    head = ["op", "shape", "cache", "`cuda_ws3`", "`cuda_ws3p`"] + [f"`cuda_{v}` (x ws3p)" for v in _OPT_ROWS[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (op, shape), rows in by.items():
        for sfx, cache in (("", "BF16"), ("_fp8", "FP8"), ("_l2hot", "BF16 L2-hot"), ("_fp8_l2hot", "FP8 L2-hot")):
            names = [f"cuda_{v}{sfx}" for v in _OPT_ROWS[1:]]
            if not any(n in rows for n in names):
                continue
            base = f"cuda_ws3p{sfx}"
            cells = [op, shape, cache, _cell(rows.get(f"cuda_ws3{sfx}"), False), _cell(rows.get(base), False)]
            for n in names:
                r = _cell(rows.get(n), False)
                x = _ratio(rows, base, n)
                cells.append(f"{r} ({x})" if r and x else r)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; on CPU through the Triton interpreter")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    ap.add_argument("--summary", metavar="JSON", help="print the README's key-shape table of a saved result and exit")
    ap.add_argument("--all-variants", action="store_true", help="also time the warp-specialised ws / ws2 variants")
    ap.add_argument("--opt-summary", metavar="JSON", help="print the ws3p option builds' table of a saved result")
    args = ap.parse_args()
    if args.opt_summary:
        print(opt_summary(args.opt_summary))
        return 0
    if args.table:
        print(table(args.table))
        return 0
    if args.summary:
        print(summary(args.summary))
        return 0
    if args.smoke:
        global H
        H = 16  # the interpreter is slow; FP8 rows fix d = 512
    if not torch.cuda.is_available():
        if not args.smoke:
            ap.error("no CUDA device: only --smoke (Triton interpreter) or --table run here")
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported
    recs = run(args.smoke, args.out, args.all_variants)
    failed = [r for r in recs if "error" in r]
    _log(f"{len(recs)} records, {len(failed)} failed" + (f"; results in {args.out}" if args.out else ""))
    return 1 if failed and args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
