"""The official-format fixture (DeepSeek's reference golden logits), fp32 on CPU.

QAT off: strict (max |d| <= 1e-4 at every valid position, indexer selections equal as sets).
QAT on: statistical thresholds from the fixture README, step 4 (a forward without the simulation is off
by mean 0.12, so they tell the difference).
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

FIXTURE = Path(__file__).resolve().parent / "data" / "v4-tiny-official"


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "golden.safetensors"))


def _runner(qat: bool) -> ModelRunner:
    cfg = load_config(FIXTURE)
    return ModelRunner(cfg, load_weights(FIXTURE, cfg, progress=False), dtype=torch.float32, max_num_seqs=2,
                       max_model_len=512, qat=qat)


@pytest.fixture(scope="module", params=[False, True], ids=["qat_off", "qat_on"])
def runs(request, golden):
    """Prefill, MTP and decode logits (+ indexer selections) of both prompts under one QAT setting."""
    qat = request.param
    r = _runner(qat)
    csa = [i for i, blk in enumerate(r.model.blocks) if blk.attn.kind == "csa"]
    out = {"qat": qat, "prefill": [], "mtp": [], "decode": [], "last": [], "sel_prefill": [], "sel_decode": []}
    for p in range(2):
        n = int(golden["prompt_lengths"][p])
        ids = golden["tokens"][p, :n].tolist()
        for i in csa:
            r.model.blocks[i].attn.indexer.record, r.model.blocks[i].attn.indexer.recorded = True, []
        s = r.cache.allocate_slot()
        assert r.cache.reserve(s, n)
        _, resid = r.forward_hidden([SeqChunk(s, ids, 0, "all")])
        out["prefill"].append(r.model.logits(resid))
        out["sel_prefill"].append({i: r.model.blocks[i].attn.indexer.recorded[0] for i in csa})
        out["mtp"].append(r.mtp_logits(0, resid[: n - 1], [SeqChunk(s, ids[1:n], 0, "all")]))
        r.cache.free_slot(s)
        m = int(golden["decode_prefill_lengths"][p])
        s = r.cache.allocate_slot()
        assert r.cache.reserve(s, n)
        out["last"].append(r.forward([SeqChunk(s, ids[:m], 0, "last")])[0][0])
        for i in csa:
            r.model.blocks[i].attn.indexer.recorded = []
        steps = [r.forward([SeqChunk(s, [ids[q]], q, "last")])[0][0] for q in golden["decode_positions"][p].tolist()]
        out["decode"].append(torch.stack(steps))
        out["sel_decode"].append({i: torch.cat(r.model.blocks[i].attn.indexer.recorded) for i in csa})
        r.cache.free_slot(s)
    assert r.cache.num_free_blocks == r.cache.num_blocks
    return out


def _diffs(ours: list[torch.Tensor], ref: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Per-position max |d| over every valid position of both prompts."""
    return torch.cat([(o - ref[p, :n]).abs().max(dim=-1).values for p, (o, n) in enumerate(zip(ours, lengths))])


def _sel_mismatch(ours: list[dict], golden, kind: str, tag: str, lengths: list[int]) -> float:
    bad = total = 0
    for p, n in enumerate(lengths):
        for layer, sel in ours[p].items():
            ref = golden[f"indexer_topk_{kind}_qat_{tag}_layer{layer}"][p, :n]
            for a, b in zip(sel.tolist(), ref.tolist()):
                total += 1
                bad += {x for x in a if x >= 0} != {x for x in b if x >= 0}
    return bad / total


def test_prefill(runs, golden):
    tag = "on" if runs["qat"] else "off"
    lens = golden["prompt_lengths"].tolist()
    d = _diffs(runs["prefill"], golden[f"prefill_qat_{tag}"], lens)
    mism = _sel_mismatch(runs["sel_prefill"], golden, "prefill", tag, lens)
    if not runs["qat"]:
        assert d.max() <= 1e-4
        assert mism == 0
        # Negative control: the same forward is far from the QAT-on golden, so the QAT thresholds can fail.
        assert _diffs(runs["prefill"], golden["prefill_qat_on"], lens).mean() > 0.05
    else:
        full = torch.cat([(o - golden["prefill_qat_on"][p, :n]).abs().flatten() for p, (o, n) in
                          enumerate(zip(runs["prefill"], lens))])
        assert full.mean() <= 1.5e-3 and d.median() <= 2e-3
        assert mism <= 0.03


def test_decode(runs, golden):
    tag = "on" if runs["qat"] else "off"
    ref = golden[f"decode_qat_{tag}"]
    d = torch.cat([(o - ref[p]).abs().max(dim=-1).values for p, o in enumerate(runs["decode"])])
    last = torch.stack([(o - golden[f"decode_prefill_last_qat_{tag}"][p]).abs().max() for p, o in
                        enumerate(runs["last"])])
    mism = _sel_mismatch(runs["sel_decode"], golden, "decode", tag, [40, 40])
    if not runs["qat"]:
        assert d.max() <= 1e-4 and last.max() <= 1e-4
        assert mism == 0
    else:
        full = torch.cat([(o - ref[p]).abs().flatten() for p, o in enumerate(runs["decode"])])
        assert full.mean() <= 3e-3 and d.median() <= 4e-3
        assert mism <= 0.08


def test_mtp(runs, golden):
    tag = "on" if runs["qat"] else "off"
    lens = [n - 1 for n in golden["prompt_lengths"].tolist()]
    ref = golden[f"mtp_qat_{tag}"]
    if not runs["qat"]:
        assert _diffs(runs["mtp"], ref, lens).max() <= 1e-4
    else:
        full = torch.cat([(o - ref[p, :n]).abs().flatten() for p, (o, n) in enumerate(zip(runs["mtp"], lens))])
        assert full.mean() <= 1e-2
