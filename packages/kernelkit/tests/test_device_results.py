"""kernelkit.device and kernelkit.results: run metadata and the recorded JSON."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import pathlib
import random
import stat

import pytest
import torch

import kernelkit.device as device
from kernelkit import driver_version, gpu_name, sw_versions, write_results_json


def test_cpu_only_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device.shutil, "which", lambda name: None)
    assert gpu_name() == "cpu"
    assert driver_version() is None
    v = sw_versions()
    assert set(v) == {"python", "torch", "triton", "cuda", "driver"}
    assert v["torch"] == torch.__version__ and v["driver"] is None
    try:
        assert v["triton"] == importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        assert v["triton"] is None


def test_driver_version_reads_nvidia_smi(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ver = f"{random.randint(500, 700)}.{random.randint(10, 99)}"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{ver}'\necho '{ver}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert driver_version() == ver


def test_write_results_roundtrip(tmp_path: pathlib.Path) -> None:
    recs = [{"op": "rms_norm", "shape": [random.randint(1, 9), 7168], "median_us": random.uniform(1, 99)}]
    path = write_results_json(tmp_path / "new" / "r.json", recs, {"package": "tile_kernels", "command": "x y"})
    doc = json.loads(path.read_text())
    assert doc["records"] == recs
    assert doc["meta"] == {"package": "tile_kernels"} and doc["command"] == "x y"
    assert doc["gpu"] == gpu_name() and doc["versions"]["torch"] == torch.__version__
    when = datetime.datetime.fromisoformat(doc["date"])
    assert abs(datetime.datetime.now(datetime.timezone.utc) - when).total_seconds() < 60
    assert not list(tmp_path.glob("new/*.tmp"))


def test_write_results_default_command_is_this_process(tmp_path: pathlib.Path) -> None:
    doc = json.loads(write_results_json(tmp_path / "r.json", []).read_text())
    assert "pytest" in doc["command"]


def test_write_results_bad_input(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="NaN"):
        write_results_json(tmp_path / "a.json", [{"tflops": math.nan}])
    with pytest.raises(TypeError, match="records: expected a list"):
        write_results_json(tmp_path / "a.json", "oops")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"records\[1\]"):
        write_results_json(tmp_path / "a.json", [{}, 3])  # type: ignore[list-item]
    assert not (tmp_path / "a.json").exists()
