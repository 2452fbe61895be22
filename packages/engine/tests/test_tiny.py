"""The embedded tiny checkpoint: deterministic bytes, official format the loader accepts, a working tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2.sandbox
import pytest
import torch
from tokenizers import Tokenizer

from deepinfer.engine.config_parse import load_config
from deepinfer.engine.loader import expected_tensors, load_weights
from deepinfer.engine.tiny import build_tiny_checkpoint, default_model_path
from deepinfer.engine.tiny_tokenizer import BOS, EOS
from deepinfer.tile_kernels import dequant_fp8_block, unpack_fp4

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


def _hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_same_seed_same_bytes_across_processes(tiny_dir: Path, tmp_path: Path) -> None:
    # A fresh interpreter with another hash seed must write identical files (no dict/set-order dependence).
    src = os.pathsep.join(str(p) for p in sorted((REPO / "packages").glob("*/src")))
    code = f"from deepinfer.engine.tiny import build_tiny_checkpoint; build_tiny_checkpoint({str(tmp_path)!r}, 0)"
    env = {**os.environ, "PYTHONPATH": src, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert _hashes(tmp_path) == _hashes(tiny_dir)


def test_other_seed_changes_weights_only(tiny_dir: Path, tmp_path: Path) -> None:
    other = _hashes(build_tiny_checkpoint(tmp_path, seed=1))
    base = _hashes(tiny_dir)
    assert other.keys() == base.keys()
    shards = [n for n in base if n.endswith(".safetensors")]
    assert len(shards) == 7 and all(other[n] != base[n] for n in shards)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
        assert other[name] == base[name]


def test_loads_with_official_schema(tiny_dir: Path) -> None:
    cfg = load_config(tiny_dir)
    assert cfg.compress_ratios == (0, 4, 16, 4) and cfg.num_hash_layers == 2 and cfg.num_mtp_layers == 1
    assert cfg.window_size == 32 and cfg.index_topk == 8 and cfg.quant.expert_dtype == "fp4"
    weights = load_weights(tiny_dir, cfg, progress=False)
    assert set(weights) == set(expected_tensors(cfg))
    assert any(n.startswith("mtp.0.") for n in weights)
    total = sum(p.stat().st_size for p in tiny_dir.iterdir())
    assert total < 15 * 2**20
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in weights.values())


def test_weight_values_are_sensible(tiny_dir: Path) -> None:
    cfg = load_config(tiny_dir)
    w = load_weights(tiny_dir, cfg, progress=False)
    tid = w["layers.1.ffn.gate.tid2eid"]
    assert tid.dtype == torch.int64 and tid.shape == (cfg.vocab_size, 2)
    assert bool((tid[:, 0] != tid[:, 1]).all()) and int(tid.min()) >= 0 and int(tid.max()) < 8
    wq = dequant_fp8_block(w["layers.2.attn.wo_a.weight"], w["layers.2.attn.wo_a.scale"])
    std = wq.std().item() * (wq.shape[1] ** 0.5)  # ~1 by construction (block factors 1/2..2)
    assert 0.5 < std < 2.0
    assert w["layers.2.attn.wo_a.scale"].view(torch.uint8).unique().numel() > 1  # scales differ per block
    e = unpack_fp4(w["layers.3.ffn.experts.5.w2.weight"], w["layers.3.ffn.experts.5.w2.scale"])
    assert e.shape == (256, 128) and 0.5 < e.std().item() * 128**0.5 < 2.0
    for name in ("norm.weight", "layers.0.attn.kv_norm.weight", "mtp.0.enorm.weight"):
        dev = (w[name].float() - 1).abs()
        assert w[name].dtype == torch.bfloat16 and bool((dev > 0).all())
        assert bool((dev <= 0.1 + 2**-8).all())  # 1 +- 0.1, plus bf16's half-ulp above 1
    for name in ("layers.2.ffn.gate.bias", "layers.0.attn.attn_sink", "layers.1.attn.compressor.ape", "hc_head_base"):
        t = w[name]
        assert t.dtype == torch.float32 and bool((t != 0).all()) and bool((t != 1).all())


def test_tokenizer_round_trip(tiny_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == load_config(tiny_dir).vocab_size == 1000
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    for text in ("The robot painted the sky orange.", "  naïve café — 東京 🙂\n\ttabs & 3.14", "x"):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
        with_bos = tok.encode(text).ids
        assert with_bos[0] == 0 and with_bos[1:] == ids
    assert len(tok.encode("the morning was cold", add_special_tokens=False).ids) < len("the morning was cold") / 2


def test_chat_template_renders_deepseek_turns(tiny_dir: Path) -> None:
    cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert cfg["bos_token"] == BOS and cfg["eos_token"] == EOS and cfg["add_bos_token"] is True

    def raise_exception(msg: str) -> None:
        raise ValueError(msg)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(cfg["chat_template"])
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Why?"},
    ]
    out = template.render(
        messages=msgs, bos_token=BOS, eos_token=EOS, add_generation_prompt=True, raise_exception=raise_exception
    )
    assert out == f"{BOS}Be brief.<｜User｜>Hi!<｜Assistant｜>Hello.{EOS}<｜User｜>Why?<｜Assistant｜>"
    with pytest.raises(ValueError, match="Unknown role"):
        template.render(
            messages=[{"role": "tool", "content": "x"}], bos_token=BOS, eos_token=EOS, raise_exception=raise_exception
        )


def test_default_model_path_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE", str(tmp_path))
    first = default_model_path()
    assert first.parent == tmp_path and first.name.startswith("tiny-v4-")
    stamp = (first / "config.json").stat().st_mtime_ns
    assert default_model_path() == first and (first / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary folder left behind
    (first / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        default_model_path()


def test_bad_seed_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seed"):
        build_tiny_checkpoint(tmp_path, seed=-1)
