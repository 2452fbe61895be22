"""The engine on a CUDA GPU: the official fixture in fp32 (strict, as on CPU) and the bf16 fast paths.

Marked `gpu`: CI (CPU only) does not run these; scripts/gpu_run.sh runs them on the H200.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepinfer.engine.config_parse import load_config
from deepinfer.engine.loader.load import load_weights
from deepinfer.engine.runner import ModelRunner
from deepinfer.engine.sequence import SeqChunk

pytestmark = pytest.mark.gpu
FIXTURE = Path(__file__).resolve().parent / "data" / "v4-tiny-official"


@pytest.fixture(scope="module")
def golden():
    if not torch.cuda.is_available():
        pytest.fail("GPU tests need CUDA (run them on the GPU machine with -m gpu)")
    return load_file(str(FIXTURE / "golden.safetensors"))


def _runner(dtype: torch.dtype, max_num_seqs: int = 4) -> ModelRunner:
    cfg = load_config(FIXTURE)
    return ModelRunner(cfg, load_weights(FIXTURE, cfg, progress=False), dtype=dtype, device="cuda",
                       max_num_seqs=max_num_seqs, max_model_len=512, gpu_memory_utilization=0.5)


def test_fixture_fp32_on_cuda(golden):
    r = _runner(torch.float32)
    for p in range(2):
        n = int(golden["prompt_lengths"][p])
        ids = golden["tokens"][p, :n].tolist()
        slot = r.cache.allocate_slot()
        assert r.cache.reserve(slot, n)
        m = int(golden["decode_prefill_lengths"][p])
        first = r.forward([SeqChunk(slot, ids[:m], 0, "all")])[0]
        steps = [r.forward([SeqChunk(slot, [ids[q]], q, "last")])[0] for q in range(m, n)]
        r.cache.free_slot(slot)
        got = torch.cat([first, *steps]).cpu()
        assert (got - golden["prefill_qat_off"][p, :n]).abs().max() <= 1e-4


def test_grouped_moe_matches_loop_bf16(golden):
    """The grouped-GEMM expert path equals the per-expert loop on random bf16 inputs (op level)."""
    r = _runner(torch.bfloat16)
    moe = r.model.blocks[3].moe  # a routed (non-hash) layer with FP4 experts
    x = torch.randn(96, r.cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(2, r.cfg.vocab_size, (96,), device="cuda")
    weights, experts = moe.route(x, ids)
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=len(moe.experts))
    tok, w = order // experts.shape[1], weights.flatten()[order]
    loop = moe._loop(x, tok, w, counts.tolist())
    from deepinfer.engine.model.moe_grouped import GroupedExperts

    grouped = GroupedExperts(moe.experts, torch.bfloat16)(x, tok, w, counts)
    rel = ((grouped - loop).norm() / loop.norm()).item()
    assert rel < 1e-2  # bf16 operands, fp32 accumulation: both paths round the same values differently
    from deepinfer.engine.model.moe_grouped import GroupedExpertsFP4

    fp4 = GroupedExpertsFP4(moe.experts)(x, tok, w, counts)  # packed FP4 weights, dequantised in registers
    rel4 = ((fp4 - loop).norm() / loop.norm()).item()
    print(f"grouped bf16 vs loop {rel:.2e}, FP4 kernel vs loop {rel4:.2e}")
    assert rel4 < 1e-2


def _decode_logits(r: ModelRunner, prompts: list[list[int]], steps: int, prefetch: bool = False) -> torch.Tensor:
    slots = [r.cache.allocate_slot() for _ in prompts]
    for s, p in zip(slots, prompts):
        assert r.cache.reserve(s, len(p) + steps)
    last = r.forward([SeqChunk(s, p, 0, "last") for s, p in zip(slots, prompts)])
    tok = [int(x.argmax()) for x in last]
    out = []
    for i in range(steps):
        chunks = [SeqChunk(s, [t], len(p) + i, "last") for s, p, t in zip(slots, prompts, tok)]
        logits = r.forward(chunks)
        if prefetch:
            r.prefetch_next(chunks)  # the next step's layout, uploaded while this one runs
        out.append(torch.cat(logits))
        tok = [int(x.argmax()) for x in logits]
    for s in slots:
        r.cache.free_slot(s)
    return torch.stack(out).cpu()


def test_cuda_graph_decode_matches_eager(golden):
    """Replaying the captured decode step gives the eager step's logits (3 sequences: padded to bucket 4)."""
    r = _runner(torch.bfloat16)
    assert r.graphs is not None
    prompts = [golden["tokens"][0, :n].tolist() for n in (120, 127, 131)]  # around window/ratio boundaries
    graphs = r.graphs
    with_graphs = _decode_logits(r, prompts, 12)
    assert graphs.graphs, "no graph was captured"
    prefetched = _decode_logits(r, prompts, 12, prefetch=True)
    # same graph, same inputs; only the MoE's atomic index_add_ order may differ between replays
    cos_p = torch.nn.functional.cosine_similarity(prefetched.flatten(), with_graphs.flatten(), dim=0).item()
    assert cos_p > 0.9999, cos_p
    assert (prefetched.argmax(-1) == with_graphs.argmax(-1)).float().mean() > 0.95
    r.graphs = None
    eager = _decode_logits(r, prompts, 12)
    cos = torch.nn.functional.cosine_similarity(with_graphs.flatten(), eager.flatten(), dim=0).item()
    assert cos > 0.9999, cos
    assert (with_graphs.argmax(-1) == eager.argmax(-1)).float().mean() > 0.95
