"""Compile (never run) every deep_ep Triton kernel variant for sm_90a with the Triton on the path, without a GPU.

Why: the GPU machine runs Triton 3.6 while CI runs a newer one under the interpreter, which accepts code 3.6
refuses (round 1: a name typed int64 in one branch of a runtime `if` and int32 in the other; a non-constexpr
global). A stub driver reports an sm_90 target, kernels are called through their normal wrappers with CPU
tensors, Triton compiles them down to a cubin (its bundled ptxas), and the launch then fails on the stub:
that failure means "compiled". Any CompilationError is printed and makes the exit status 1.

    pip download triton==3.6.0 --no-deps -d /tmp/t36 && python -m zipfile -e /tmp/t36/triton-3.6.0-*.whl /tmp/t36/site
    chmod +x /tmp/t36/site/triton/backends/nvidia/bin/*
    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36/site:$(ls -d $PWD/packages/*/src | paste -sd:) \\
        python packages/deep_ep/benchmarks/triton_compile_check.py
"""

from __future__ import annotations

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.errors import CompilationError
from triton.runtime import driver


class _StubDriver:
    """Just enough of a driver for the JIT to pick a target and compile; launching raises."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def __getattr__(self, name: str):
        raise RuntimeError(f"stub driver: {name}")


def _attempt(results: list[tuple[str, bool]], name: str, fn, *args, **kwargs) -> None:
    """fn(*args, **kwargs): a compile error is a failure, the stub's launch error a success."""
    try:
        fn(*args, **kwargs)
    except CompilationError as exc:
        print(f"{name}: COMPILE FAILED\n{str(exc)[-3000:]}\ncause: {exc.__cause__!r}", flush=True)
        results.append((name, False))
        return
    except RuntimeError as exc:
        if "stub driver" not in str(exc):
            raise
    results.append((name, True))


def _ll_cases(results: list[tuple[str, bool]]) -> None:
    from deepinfer.deep_ep.backends.triton import ll
    from deepinfer.deep_ep.lowlatency import LLLayout

    for world in (2, 8):
        for fp8 in (False, True):
            per, k, hidden, max_t, t = 4, 6, 4096, 128, 5
            xw, sw = (hidden // 4, hidden // 128) if fp8 else (hidden // 2, 0)
            lay = LLLayout.of(world, per, max_t, k, xw, sw, hidden)
            bufs = [torch.zeros(lay.words, dtype=torch.int32) for _ in range(world)]
            ctr, slots = torch.zeros(4, dtype=torch.int32), max_t * world
            idx, x = torch.zeros(t, k, dtype=torch.int64), torch.zeros(t, xw, dtype=torch.int32)
            s = torch.zeros(t, sw, dtype=torch.int32) if fp8 else None
            out = torch.zeros(per, slots, xw, dtype=torch.int32)
            out_s = torch.zeros(per, slots, sw, dtype=torch.int32) if fp8 else None
            meta, cnt = torch.zeros(per, slots, 4, dtype=torch.int32), torch.zeros(per, dtype=torch.int32)
            y = torch.zeros(per, slots, hidden // 2, dtype=torch.int32)
            o, w = torch.zeros(t, hidden, dtype=torch.bfloat16), torch.zeros(t, k)
            tag = f"R={world} fp8={fp8}"
            me, me_y = bufs[0], bufs[0].view(torch.bfloat16)
            _attempt(results, f"ll_send {tag}", ll.ll_send, x, s, idx, ctr, bufs, 0, per, max_t, per * world, lay)
            _attempt(results, f"signal {tag}", ll.signal, ctr, 0, bufs, 0, lay.flags)
            _attempt(results, f"ll_recv {tag}", ll.ll_recv, me, ctr, out, out_s, meta, cnt, world, max_t, lay, 9)
            _attempt(results, f"ll_combine_send {tag}", ll.ll_combine_send, y, meta, cnt, ctr, bufs, k, lay)
            _attempt(results, f"ll_combine_reduce {tag}", ll.ll_combine_reduce, me, me_y, ctr, idx, w, o, world, lay, 9)
    for rs, ue in ((False, False), (True, False), (True, True)):
        xx, vals = torch.zeros(4, 4096, dtype=torch.bfloat16), torch.empty((4, 4096), dtype=torch.int8)
        sc = torch.empty((4, 32), dtype=torch.uint8 if ue else torch.float32)
        launch = ll._quant_kernel[(4,)]  # RECIP=True: the variant CUDA runs
        consts = {"NBLK": 32, "ROUND": rs, "UE8M0": ue, "RECIP": True}
        _attempt(results, f"quant round={rs} ue8m0={ue}", launch, xx, vals, sc, 4, 4096, **consts)


def _fused_cases(results: list[tuple[str, bool]]) -> None:
    from deepinfer.deep_ep.backends.triton import fused as f
    from deepinfer.deep_ep.backends.triton import rows

    t, k, e, r, cap = 64, 8, 256, 2, 200
    idx, row = torch.zeros(t, k, dtype=torch.int64), torch.zeros(f.row_width(r, e), dtype=torch.int64)
    layout, pos = torch.zeros(t, r, dtype=torch.bool), torch.zeros(r, t, dtype=torch.int64)
    _attempt(results, "layout_row", f.layout_row, idx, None, row, layout, pos, e, [1, 2, 3, k, t])
    _attempt(results, "layout_row given", f.layout_row, idx, layout, row, layout, pos, e, [1, 2, 3, k, t])
    x, s = torch.zeros(t, 2048, dtype=torch.int32), torch.zeros(t, 32, dtype=torch.int32)
    d0, d1 = torch.zeros(cap, 2048, dtype=torch.int32), torch.zeros(cap, 32, dtype=torch.int32)
    didx, dw, dsrc = torch.zeros(cap, k, dtype=torch.int64), torch.zeros(cap, k), torch.zeros(cap, 1, dtype=torch.int64)
    w, sp, st = torch.zeros(t, k), torch.zeros(t, dtype=torch.int64), torch.zeros(2 * t, dtype=torch.int64)
    meta = (idx, w, didx, dw, dsrc, 128, 128)
    _attempt(results, "push_rows 1 field", f.push_rows, pos[1], 0, 3, 5, [(x, d0)], meta, (sp, st))
    _attempt(results, "push_rows 2 fields", f.push_rows, pos[1], 0, 3, 5, [(x, d0), (s, d1)], meta, (sp, st))
    as32 = [v.view(torch.int32) for v in (didx, dw, dsrc)]
    pairs = [(d0, d0.clone()), (d1, d1.clone()), *[(v, v.clone()) for v in as32]]
    _attempt(results, "copy_rows 5 fields", f.copy_rows, pairs, 100, (3, 50))
    _attempt(results, "copy_rows 4 fields", f.copy_rows, pairs[:1] + pairs[2:], 100, (3, 50))
    src, dst = torch.zeros(t, 2048, dtype=torch.int32), torch.zeros(t // 2, 2048, dtype=torch.int32)
    _attempt(results, "gather_rows", rows.gather_rows, src, torch.arange(t // 2), dst, "triton")


def _nosync_cases(results: list[tuple[str, bool]]) -> None:
    from deepinfer.deep_ep.backends.triton import nosync as n

    t, k, e, cap = 64, 6, 256, 200
    for r in (2, 8):
        area, mat = torch.zeros(r, 2 * r + e + 7, dtype=torch.int64), torch.zeros(r * r + 2, dtype=torch.int64)
        _attempt(results, f"nosync plan R={r}", n.plan, area, mat, torch.zeros(e // r, dtype=torch.int32), 1, e, 3, cap)
        idx, w = torch.zeros(t, k, dtype=torch.int64), torch.zeros(t, k)
        x, s = torch.zeros(t, 2048, dtype=torch.int32), torch.zeros(t, 32, dtype=torch.int32)
        d0, d1 = torch.zeros(cap, 2048, dtype=torch.int32), torch.zeros(cap, 32, dtype=torch.int32)
        didx, dw = torch.zeros(cap, k, dtype=torch.int64), torch.zeros(cap, k)
        dsrc, pos = torch.zeros(cap, 1, dtype=torch.int64), torch.zeros(t, dtype=torch.int64)
        sp, st = torch.zeros(t, dtype=torch.int64), torch.zeros(r * t, dtype=torch.int64)
        meta = (idx, w, didx, dw, dsrc, 128, e // r)
        _attempt(results, f"nosync push 1 field R={r}", n.push, pos, mat, 1, 0, cap, [(x, d0)], meta, (sp, st))
        two = [(x, d0), (s, d1)]
        _attempt(results, f"nosync push 2 fields R={r}", n.push, pos, mat, 0, 1, cap, two, meta, (sp, st))
        pair1 = [(x, d0, d0.clone())]
        pmeta = (idx, w, didx, dw, dsrc, didx.clone(), dw.clone(), dsrc.clone(), e // r)
        pos2d, sp2 = torch.zeros(r, t, dtype=torch.int64), torch.zeros(r, t, dtype=torch.int64)
        _attempt(
            results, f"nosync push_pair 1 field R={r}", n.push_pair, pos2d, mat, 0, 1, cap, pair1, pmeta, (sp2, st)
        )
        pair2 = [*pair1, (s, d1, d1.clone())]
        _attempt(
            results, f"nosync push_pair 2 fields R={r}", n.push_pair, pos2d, mat, 1, 0, cap, pair2, pmeta, (sp2, st)
        )
        _attempt(results, f"nosync push cached R={r}", n.push, pos, mat, 0, 1, cap, [(x, d0)], from_send_pos=True)
        as32 = [(v.view(torch.int32), v.clone().view(torch.int32)) for v in (didx, dw, dsrc)]
        outs = [(d0, d0.clone()), (d1, d1.clone())]
        _attempt(results, f"nosync copy_out meta R={r}", n.copy_out, mat, 1, cap, outs, as32)
        _attempt(results, f"nosync copy_out cached R={r}", n.copy_out, mat, 1, cap, [(d0, d0.clone())], None)
        yw = torch.zeros(cap, 2048, dtype=torch.int32)
        _attempt(results, f"nosync combine_send R={r}", n.combine_send, mat, 0, 1, cap, [(yw, d0)], cap)
        _attempt(results, f"nosync combine_send 2 R={r}", n.combine_send, mat, 0, 1, cap, [(yw, d0), (s, d1)], cap)
        pos2, yb = torch.zeros(r, t, dtype=torch.int64), torch.zeros(cap, 4096, dtype=torch.bfloat16)
        back, o = torch.zeros(r * cap, 4096, dtype=torch.bfloat16), torch.zeros(t, 4096, dtype=torch.bfloat16)
        _attempt(results, f"nosync reduce bf16 R={r}", n.reduce, pos2, mat, 1, back, yb, o)
        _attempt(results, f"nosync reduce fp32 R={r}", n.reduce, pos2, mat, 1, torch.zeros(r * cap, k),
                 torch.zeros(cap, k), torch.zeros(t, k))  # fmt: skip


def _overlap_cases(results: list[tuple[str, bool]]) -> None:
    from deepinfer.deep_ep._overlap import CombineLayout, DispatchLayout, tag_bytes
    from deepinfer.deep_ep.backends.triton import overlap as ov

    t, k, e, cap = 64, 6, 256, 200
    for r in (2, 8):
        for fp8 in (False, True):
            widths = [4096, 128] if fp8 else [8192]
            lay = DispatchLayout.of(r, e, cap, widths, k, tag_bytes(r, cap, widths))
            bufs = [torch.zeros(lay.nbytes, dtype=torch.uint8) for _ in range(r)]
            ctr, done = torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.int32)
            idx, w = torch.zeros(t, k, dtype=torch.int64), torch.zeros(t, k)
            nb = ov.num_blocks(t)
            sizes = {"bcnt": r * nb, "bstat": nb * (2 + r), "bexp": nb * e}
            scratch = {name: torch.zeros(n, dtype=torch.int64) for name, n in sizes.items()}
            lpos, layout = torch.zeros(r, t, dtype=torch.int64), torch.zeros(t, r, dtype=torch.bool)
            tag = f"R={r} fp8={fp8}"
            _attempt(results, f"overlap layout {tag}", ov.layout, idx, None, layout, lpos, scratch, ctr, e)
            _attempt(results, f"overlap layout given {tag}", ov.layout, idx, layout, layout, lpos, scratch, ctr, e)
            xs = [torch.zeros(t, wb // 4, dtype=torch.int32) for wb in widths]
            outs = [torch.zeros(cap, wb // 4, dtype=torch.int32) for wb in widths]
            meta = (torch.zeros(cap, k, dtype=torch.int64), torch.zeros(cap, k), torch.zeros(cap, 1, dtype=torch.int64))
            handle = (torch.zeros(r, t, dtype=torch.int64), torch.zeros(r * t, dtype=torch.int64))
            mat, counts = torch.zeros(r * r + 2, dtype=torch.int64), torch.zeros(e // r, dtype=torch.int32)
            cfgs = [(o, "base", None) for o in ov.ORDERS] + [("mixed", "early", None), ("mixed", "fused", None)]
            for order, config, given in cfgs + [("mixed", "fused", layout)]:
                _attempt(results, f"overlap dispatch {tag} order={order} config={config} given={given is not None}",
                         ov.dispatch, bufs, 1, ctr, done, lay, cap, lpos, scratch, xs, idx, w, handle, outs, meta, mat,
                         counts, e, 3, [1, 4096, 0, k, cap], 1 << 27, order, config, given, layout)  # fmt: skip
            for diag in [d for d in ov.DIAGS if d and r == 2 and not fp8]:  # benchmark-only kernels
                _attempt(results, f"overlap dispatch {tag} diag={diag}", ov.dispatch, bufs, 1, ctr, done, lay, cap,
                         lpos, scratch, xs, idx, w, handle, outs, meta, mat, counts, e, 3, [1, 4096, 0, k, cap],
                         1 << 27, "mixed", "base", None, layout, diag)  # fmt: skip
        for weights in (False, True):
            fields = [torch.zeros(cap, 4096, dtype=torch.bfloat16)] + ([torch.zeros(cap, k)] if weights else [])
            crb = [f.shape[1] * f.element_size() for f in fields]
            clay = CombineLayout.of(r, cap, crb, tag_bytes(r, cap, crb))
            cbufs = [torch.zeros(clay.nbytes, dtype=torch.uint8) for _ in range(r)]
            outs = [torch.zeros(t, f.shape[1], dtype=f.dtype) for f in fields]
            words = [f.view(torch.int32) for f in fields]
            pos = torch.zeros(r, t, dtype=torch.int64)
            for config in ov.COMBINE_CONFIGS:
                _attempt(results, f"overlap combine R={r} weights={weights} config={config}", ov.combine, cbufs, 0,
                         ctr, done, clay, cap, pos, mat, fields, words, outs, 1 << 27, config)  # fmt: skip
        _attempt(results, f"overlap bump R={r}", ov.bump, ctr, 1)


def main() -> int:
    print(f"triton {triton.__version__} ({triton.__file__}), target sm_90", flush=True)
    driver.set_active(_StubDriver())
    results: list[tuple[str, bool]] = []
    _ll_cases(results)
    _fused_cases(results)
    _nosync_cases(results)
    _overlap_cases(results)
    for name, ok in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
