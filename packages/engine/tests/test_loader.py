"""loader: schema vs the official fixture, full load + golden dequantisation, bad checkpoints, hub ids."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from deepinfer.engine.config_parse import load_config
from deepinfer.engine.loader import allowed_dtypes, expected_tensors, load_weights, resolve_model_path
from deepinfer.engine.loader.safetensors_io import read_raw
from deepinfer.tile_kernels import dequant_fp8_block, unpack_fp4

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "v4-tiny-official"
INDEX = "model.safetensors.index.json"
ROOT_SHARD = "model-00008-of-00009.safetensors"  # head, norm, hc_head_*: small, cheap to rewrite


@pytest.fixture(scope="module")
def cfg():
    return load_config(FIXTURE)


@pytest.fixture(scope="module")
def weights(cfg):
    return load_weights(FIXTURE, cfg, progress=False)


def _stored() -> dict[str, tuple[tuple[int, ...], str]]:
    weight_map = json.loads((FIXTURE / INDEX).read_text())["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(str(FIXTURE / shard), "pt") as f:
            out.update({k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()})
    assert set(out) == set(weight_map)
    return out


def test_schema_reproduces_fixture_index(cfg) -> None:
    expected, stored = expected_tensors(cfg), _stored()
    assert len(expected) == 596
    assert set(expected) == set(stored)
    assert {k: v[0] for k, v in expected.items()} == {k: v[0] for k, v in stored.items()}
    header_kind = {"F8_E4M3": "fp8_weight", "I8": "fp4_weight", "BF16": "bf16", "F32": "f32", "I64": "int"}
    for name, (_, kind) in expected.items():
        got = stored[name][1]
        if got == "F8_E8M0":
            assert kind in ("fp8_scale", "fp4_scale"), name
        else:
            assert header_kind[got] == kind, name


def test_schema_variants(cfg) -> None:
    plain = expected_tensors(
        dataclasses.replace(cfg, quant=dataclasses.replace(cfg.quant, fmt=None, expert_dtype="bf16"))
    )
    assert not [n for n in plain if n.endswith(".scale")]
    assert plain["layers.2.ffn.experts.4.w2.weight"] == ((256, 128), "bf16")
    assert plain["layers.1.attn.wo_a.weight"] == ((256, 512), "bf16")
    fp8 = expected_tensors(dataclasses.replace(cfg, quant=dataclasses.replace(cfg.quant, expert_dtype="fp8")))
    assert fp8["layers.3.ffn.experts.0.w1.weight"] == ((128, 256), "fp8_weight")
    assert fp8["layers.3.ffn.experts.0.w1.scale"] == ((1, 2), "fp8_scale")
    small = expected_tensors(
        dataclasses.replace(cfg, tie_word_embeddings=True, num_mtp_layers=0, mtp_compress_ratios=())
    )
    assert "head.weight" not in small and not [n for n in small if n.startswith("mtp.")]
    assert len(expected_tensors(cfg)) - len(small) == 1 + 87
    with pytest.raises(NotImplementedError, match="DSpark"):
        expected_tensors(dataclasses.replace(cfg, dspark=object()))


def test_fixture_loads_completely(cfg, weights) -> None:
    expected = expected_tensors(cfg)
    assert set(weights) == set(expected) and len(weights) == 596
    for name, (shape, kind) in expected.items():
        assert tuple(weights[name].shape) == shape, name
        assert weights[name].dtype == allowed_dtypes(kind)[0], name  # the release's storage dtypes
    assert weights["layers.1.attn.wkv.scale"].dtype == torch.float8_e8m0fnu
    assert weights["layers.0.ffn.gate.tid2eid"].dtype == torch.int64
    # The reference inference/config.json describes the same checkpoint.
    ref_cfg = load_config(FIXTURE / "inference" / "config.json")
    assert set(load_weights(FIXTURE, ref_cfg, progress=False)) == set(weights)


def _dequant(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    w, scale = weights[name], weights[name.removesuffix("weight") + "scale"]
    if w.dtype == torch.float8_e4m3fn:
        return dequant_fp8_block(w, scale, block=(128, 128), dtype=torch.float64)
    return unpack_fp4(w, scale, block=32, dtype=torch.float64)


def test_golden_dequant(weights) -> None:
    golden = load_file(str(FIXTURE / "golden.safetensors"))
    exact = [k for k in golden if k.startswith("dequant.")]
    sums = [k for k in golden if k.startswith(("dequant_rowsum.", "dequant_colsum."))]
    assert len(exact) == 2 and len(sums) == 16
    for key in exact:  # e4m3/e2m1 value times a power of two is exact in fp32 and fp64
        assert torch.equal(_dequant(weights, key.removeprefix("dequant.")), golden[key].double()), key
    for key in sums:
        kind, name = key.split(".", 1)
        deq = _dequant(weights, name)
        dim = 1 if kind == "dequant_rowsum" else 0
        # fp64 sums of exact values differ only by summation order: |err| <= n * eps64 * sum|x|.
        tol = deq.shape[dim] * torch.finfo(torch.float64).eps * deq.abs().sum(dim)
        assert ((deq.sum(dim) - golden[key]).abs() <= tol).all(), key


def test_progress_bar(cfg, capsys) -> None:
    load_weights(FIXTURE, cfg, progress=True)
    assert "596/596" in capsys.readouterr().err


def test_read_raw_matches_safetensors() -> None:
    path = FIXTURE / "model-00003-of-00009.safetensors"
    ref = load_file(str(path))
    for name, t in ref.items():
        raw = read_raw(path, name)
        assert raw.dtype == t.dtype and raw.shape == t.shape, name
        assert torch.equal(raw.view(torch.uint8), t.view(torch.uint8)), name


def _clone(tmp_path: Path, skip: tuple[str, ...] = ()) -> Path:
    """Copy of the fixture made of symlinks (cheap); files in `skip` are left out for the test to write."""
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in FIXTURE.iterdir():
        if f.is_file() and f.name not in skip and f.name != "golden.safetensors":
            (out / f.name).symlink_to(f)
    return out


def _rewrite_root_shard(tmp_path: Path, edit) -> Path:
    """Clone with the root shard (and index) rewritten after `edit(tensors)` mutates its tensor dict."""
    out = _clone(tmp_path, skip=(ROOT_SHARD, INDEX))
    tensors = load_file(str(FIXTURE / ROOT_SHARD))
    edit(tensors)
    save_file(tensors, str(out / ROOT_SHARD), metadata={"format": "pt"})
    index = json.loads((FIXTURE / INDEX).read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != ROOT_SHARD}
    index["weight_map"].update({k: ROOT_SHARD for k in tensors})
    (out / INDEX).write_text(json.dumps(index))
    return out


def test_missing_dir(cfg, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_weights(tmp_path / "nowhere", cfg)


def test_missing_shard(cfg, tmp_path: Path) -> None:
    out = _clone(tmp_path, skip=("model-00004-of-00009.safetensors",))
    with pytest.raises(FileNotFoundError, match=r"model-00004-of-00009\.safetensors.*layers\.2\."):
        load_weights(out, cfg)


@pytest.mark.parametrize("keep", [100, 0.5])
def test_truncated_shard(cfg, tmp_path: Path, keep: float) -> None:
    name = "model-00005-of-00009.safetensors"
    out = _clone(tmp_path, skip=(name,))
    data = (FIXTURE / name).read_bytes()
    (out / name).write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(ValueError, match=name):
        load_weights(out, cfg)


def test_wrong_shape(cfg, tmp_path: Path) -> None:
    out = _rewrite_root_shard(tmp_path, lambda t: t.update({"norm.weight": torch.randn(255).bfloat16()}))
    with pytest.raises(ValueError, match=r"norm\.weight: expected shape \[256\], got \[255\]"):
        load_weights(out, cfg)


def test_wrong_dtype(cfg, tmp_path: Path) -> None:
    out = _rewrite_root_shard(
        tmp_path, lambda t: t.update({"hc_head_base": torch.randint(1, 9, (4,), dtype=torch.int32)})
    )
    with pytest.raises(ValueError, match=r"hc_head_base: expected dtype .*got int32"):
        load_weights(out, cfg)


def test_missing_and_unexpected(cfg, tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t["head.weight_extra"] = t.pop("head.weight")
        # MTP copies of the shared embedding / head are dropped like DeepSeek's convert.py does: not "unexpected".
        t["mtp.0.head.weight"] = torch.randn(512, 256).bfloat16()
        t["mtp.0.emb.tok_emb.weight"] = torch.randn(512, 256).bfloat16()

    out = _rewrite_root_shard(tmp_path, edit)
    with pytest.raises(
        ValueError, match=r"(?s)1 missing tensors:\n  head\.weight\n1 unexpected tensors:\n  head\.weight_extra"
    ):
        load_weights(out, cfg)


def test_config_mismatch_lists_all(cfg) -> None:
    wrong = dataclasses.replace(cfg, moe_inter_dim=64)  # every expert and shared-expert linear changes shape
    with pytest.raises(
        ValueError,
        match=r"(?s)wrong shape:.*w1\.weight: expected shape \[64, 128\], got \[128, 128\].*and \d+ more",
    ):
        load_weights(FIXTURE, wrong, progress=False)
    with pytest.raises(TypeError, match="cfg"):
        load_weights(FIXTURE, {"hidden_size": 256}, progress=False)  # type: ignore[arg-type]


def test_without_index_and_duplicates(cfg, tmp_path: Path) -> None:
    out = _clone(tmp_path, skip=(INDEX,))
    assert len(load_weights(out, cfg, progress=False)) == 596
    shutil.copy(FIXTURE / ROOT_SHARD, out / "extra.safetensors")
    with pytest.raises(ValueError, match="stored twice"):
        load_weights(out, cfg, progress=False)


def test_resolve_local_and_missing_paths(tmp_path: Path, monkeypatch) -> None:
    assert resolve_model_path(str(FIXTURE)) == FIXTURE.resolve()
    monkeypatch.chdir(tmp_path)
    for missing in (str(tmp_path / "nope" / "model"), "./nope/model", "nope"):
        with pytest.raises(FileNotFoundError, match="nope"):
            resolve_model_path(missing)
    with pytest.raises(ValueError, match="file"):
        resolve_model_path(str(FIXTURE / "config.json"))


def test_resolve_hub_id_offline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing can be found locally
    repo = f"deepinfer-tests/no-such-model-{os.getpid()}"
    with pytest.raises(RuntimeError, match=rf"(?s){repo}.*HF_HUB_OFFLINE=1"):
        resolve_model_path(repo, revision="main")
