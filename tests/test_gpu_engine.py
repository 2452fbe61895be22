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


def _runner(dtype: torch.dtype) -> ModelRunner:
    cfg = load_config(FIXTURE)
    return ModelRunner(cfg, load_weights(FIXTURE, cfg, progress=False), dtype=dtype, device="cuda",
                       max_num_seqs=2, max_model_len=512, gpu_memory_utilization=0.5)


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


def test_grouped_moe_matches_loop_bf16(golden, monkeypatch):
    n = int(golden["prompt_lengths"][0])
    ids = golden["tokens"][0, :n].tolist()
    outs = {}
    for grouped in ("0", "1"):
        monkeypatch.setenv("DEEPINFER_MOE_GROUPED", grouped)
        r = _runner(torch.bfloat16)
        slot = r.cache.allocate_slot()
        assert r.cache.reserve(slot, n)
        outs[grouped] = r.forward([SeqChunk(slot, ids, 0, "all")])[0].cpu()
    ref = golden["prefill_qat_off"][0, :n]
    cos = torch.nn.functional.cosine_similarity(outs["1"].flatten(), outs["0"].flatten(), dim=0)
    assert cos > 0.999
    # both bf16 runs stay close to the fp32 golden (bf16 activations: loose, format-derived bound)
    for o in outs.values():
        assert torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0) > 0.99
