"""Batched sampling of one decode step on the GPU: `sampler.sample_tensor` with the fused Triton race (default on
CUDA) against its torch path (DEEPINFER_SAMPLE_RACE=torch), batch 32 x V-4 vocabulary 129,280, all rows seeded
(temperature 0.8 + top-k 50, the profile's setting) and a mixed batch (top-k / greedy / top-p / min-p rows). Also
records whether both paths pick the same tokens.

    python benchmarks/bench_sampler.py --out RESULT.json   # H200, ~10 s
"""

from __future__ import annotations

import os
import sys

from gpu_script import add_src_paths, gpu_main

add_src_paths("engine", "kernelkit", "tile_kernels")

import torch  # noqa: E402

from deepinfer.engine.sampler import sample_tensor  # noqa: E402
from deepinfer.engine.sampling_params import SamplingParams  # noqa: E402

B, V = 32, 129280


def _params(kind: str) -> list[SamplingParams]:
    if kind == "seeded_topk50":
        return [SamplingParams(temperature=0.8, top_k=50)] * B
    kinds = [SamplingParams(temperature=0.8, top_k=50), SamplingParams(temperature=0), SamplingParams(top_p=0.9),
             SamplingParams(temperature=1.2, min_p=0.05)]  # fmt: skip
    return [kinds[i % 4] for i in range(B)]


def _time(fn) -> float:  # noqa: ANN001
    import kernelkit as kk

    return float(kk.bench_cuda(fn, mode="events")["median_us"])


def run(out: str | None) -> list[dict]:
    import kernelkit as kk

    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(B, V, generator=g, device="cuda") * 3
    seeds, steps = list(range(B)), [7] * B
    recs = []
    for kind in ("seeded_topk50", "mixed"):
        params = _params(kind)
        res = {}
        for path in ("triton", "torch"):
            os.environ["DEEPINFER_SAMPLE_RACE"] = path
            res[path] = sample_tensor(logits, params, seeds, steps).tolist()
            us = _time(lambda p=params: sample_tensor(logits, p, seeds, steps))
            recs.append({"batch": kind, "b": B, "vocab": V, "impl": path, "median_us": us})
            print(f"{kind} {path}: {us:.1f} us (events: host launch included)", flush=True)
        os.environ.pop("DEEPINFER_SAMPLE_RACE")
        for r in recs[-2:]:
            r["same_tokens"] = res["triton"] == res["torch"]
        print(f"{kind}: same tokens {res['triton'] == res['torch']}", flush=True)
    if out:
        kk.write_results_json(out, recs, {"bench": "bench_sampler", "timer": "events (host launch included)"})
    return recs


if __name__ == "__main__":
    sys.exit(gpu_main(__doc__, run))
