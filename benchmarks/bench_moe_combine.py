"""The engine's MoE combine (sum of each token's k weighted expert rows) on the GPU: the session-8 one-kernel
fixed-order `combine_weighted` (sort + tile_kernels `moe_unpermute`) against session 7's `combine_rows` (fp32
products, sort, gather, k adds) and the atomic `index_add_` (not run-to-run deterministic). V4-Flash: hidden 4096,
k = 6 of 256 experts; decode t = 32 / 256 tokens and prefill t = 4096. Also checks the two fixed-order paths give the
CPU index_add_ bits.

    python benchmarks/bench_moe_combine.py --out RESULT.json   # H200, ~10 s
"""

from __future__ import annotations

import sys

from gpu_script import add_src_paths, gpu_main

add_src_paths("engine", "kernelkit", "tile_kernels")

import torch  # noqa: E402

from deepinfer.engine.model.deterministic import combine_rows, combine_weighted  # noqa: E402

H, K, E = 4096, 6, 256


def _pairs(t: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tok [t*k] (pairs sorted by expert, as MoE.forward), y bf16 [t*k, H], w fp32 [t*k]."""
    ids = torch.rand(t, E, generator=g).argsort(dim=1)[:, :K]
    tok = torch.argsort(ids.flatten(), stable=True) // K
    return tok, torch.randn(t * K, H, generator=g).bfloat16(), torch.rand(t * K, generator=g) + 0.01


def _impls(t: int, tok: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> dict:
    """name -> zero-argument call of each combine on the GPU copies of one case."""
    return {
        "combine_weighted": lambda: combine_weighted(t, tok, y, w),
        "combine_rows": lambda: combine_rows(t, tok, y.float() * w[:, None]),
        "index_add_atomic": lambda: torch.zeros(t, H, device="cuda").index_add_(0, tok, y.float() * w[:, None]),
    }


def run(out: str | None) -> list[dict]:
    import kernelkit as kk

    g = torch.Generator().manual_seed(0)
    recs = []
    for t in (32, 256, 4096):
        tok, y, w = _pairs(t, g)
        want = torch.zeros(t, H).index_add_(0, tok, y.float() * w[:, None])
        impls = _impls(t, tok.cuda(), y.cuda(), w.cuda())
        for name, fn in impls.items():
            res = fn()
            us = float(kk.bench_cuda(fn, mode="events")["median_us"])
            same = torch.equal(res.cpu(), want)
            rec = {"t": t, "k": K, "hidden": H, "impl": name, "median_us": us, "equal_to_cpu": same}
            recs.append(rec)
            print(f"t={t} {name}: {us:.1f} us (with launch overhead), equal to CPU index_add_: {rec['equal_to_cpu']}",
                  flush=True)  # fmt: skip
    if out:
        kk.write_results_json(out, recs, {"bench": "bench_moe_combine", "timer": "events (host launch included)"})
    return recs


if __name__ == "__main__":
    sys.exit(gpu_main(__doc__, run))
