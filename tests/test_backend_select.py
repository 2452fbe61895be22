"""Backend selection (`_backend.py`, identical in every kernel package) on a throwaway package.

The module derives its package name from ``__package__``, so a copy under ``fakens.fakepkg`` reads
``DEEPINFER_FAKEPKG_BACKEND`` and probes ``fakens.fakepkg._C``: every branch (compiled extension,
Triton, Ascend, forced choices, broken builds) can be exercised on a CPU machine.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import random
import shutil
import sys
import types
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "packages/tile_kernels/src/deepinfer/tile_kernels/_backend.py"
ENV = "DEEPINFER_FAKEPKG_BACKEND"


class FakePkg:
    """A package ``fakens.fakepkg`` in a temp dir holding a copy of _backend.py."""

    def __init__(self, root: pathlib.Path) -> None:
        self.dir = root / "fakens" / "fakepkg"
        self.dir.mkdir(parents=True)
        (self.dir / "__init__.py").write_text('__version__ = "0.0.1"\n')
        (self.dir / "backends.py").write_text('IMPLEMENTED = ("triton",)\n')
        shutil.copy(SRC, self.dir / "_backend.py")

    def add(self, name: str, text: str) -> None:
        (self.dir / f"{name}.py").write_text(text)

    def load(self) -> types.ModuleType:
        importlib.invalidate_caches()
        return importlib.import_module("fakens.fakepkg._backend")


@pytest.fixture
def fake(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePkg]:
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in (ENV, "TRITON_INTERPRET"):
        monkeypatch.delenv(var, raising=False)
    yield FakePkg(tmp_path)
    for name in [m for m in sys.modules if m == "fakens" or m.startswith("fakens.")]:
        del sys.modules[name]


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def test_auto_ladder(fake: FakePkg, monkeypatch: pytest.MonkeyPatch) -> None:
    b = fake.load()
    assert b.ENV_VAR == ENV and b.DIST_NAME == "deepinfer-fakepkg"
    assert b.backend("cpu") == "reference"
    assert b.backend("npu:0") == "reference"  # no torch_npu
    monkeypatch.setitem(sys.modules, "triton", None)  # None in sys.modules makes `import triton` fail
    assert b.backend("cuda:1") == "reference"


def test_no_triton_kernels_means_reference(fake: FakePkg) -> None:
    """A package that declares no Triton kernels never claims the Triton backend, even on CUDA."""
    fake.add("backends", "IMPLEMENTED = ()\n")
    b = fake.load()
    assert b.backend("cuda") == "reference"


@pytest.mark.skipif(not _has_triton(), reason="triton is a test dependency (.ci/run installs it)")
def test_auto_prefers_compiled_then_triton(fake: FakePkg) -> None:
    assert fake.load().backend("cuda") == "triton"
    del sys.modules["fakens.fakepkg._backend"]
    fake.add("_C", "")
    b = fake.load()
    assert b.backend("cuda:0") == "cuda" and b.backend(0) == "cuda"
    assert b.backend("cpu") == "reference"


def test_ascend_when_torch_npu_imports(fake: FakePkg, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    b = fake.load()
    assert b.backend("npu") == "ascend" and b.backend("cpu") == "reference"


def test_forced_choices(fake: FakePkg, monkeypatch: pytest.MonkeyPatch) -> None:
    b = fake.load()
    monkeypatch.setenv(ENV, "reference")
    assert b.backend("cuda") == "reference"
    monkeypatch.setenv(ENV, " CUDA ")
    with pytest.raises(RuntimeError, match=f"{ENV}=cuda but it is unavailable: .*not built"):
        b.backend("cuda")
    monkeypatch.setenv(ENV, "ascend")
    with pytest.raises(RuntimeError, match=f"{ENV}=ascend .*not 'npu'"):
        b.backend("cuda")
    monkeypatch.setenv(ENV, "triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        b.backend("cpu")
    monkeypatch.setenv(ENV, "fastest")
    with pytest.raises(ValueError, match=f"{ENV}: expected one of auto.cuda.triton.ascend.reference, got 'fastest'"):
        b.backend("cpu")


@pytest.mark.skipif(not _has_triton(), reason="triton is a test dependency (.ci/run installs it)")
def test_interpreter_only_when_forced(fake: FakePkg, monkeypatch: pytest.MonkeyPatch) -> None:
    b = fake.load()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert b.backend("cpu") == "reference"  # auto never routes CPU calls through the interpreter
    monkeypatch.setenv(ENV, "triton")
    assert b.backend("cpu") == "triton"


def test_broken_extension_warns_and_falls_back(fake: FakePkg, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add("_C", "raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    monkeypatch.setitem(sys.modules, "triton", None)
    b = fake.load()
    with pytest.warns(RuntimeWarning, match="libcudart"):
        assert b.backend("cuda") == "reference"
    monkeypatch.setenv(ENV, "cuda")
    with pytest.raises(RuntimeError, match="failed to import: libcudart"):
        b.backend("cuda")


def test_bad_device(fake: FakePkg) -> None:
    b = fake.load()
    with pytest.raises(ValueError, match="device: expected a torch device string like 'cuda:0', got 'gpu'"):
        b.backend("gpu")
    with pytest.raises(TypeError, match="device: expected torch.device, str, int or None, got float"):
        b.backend(1.5)


def test_build_info_from_source_and_from_a_build(fake: FakePkg, tmp_path: pathlib.Path) -> None:
    b = fake.load()
    info = b.build_info()
    assert info["built_for"] == "source" and info["compiled_backends"] == [] and info["version"] == "0.0.1"
    assert info["path"] == str(fake.dir) and info["backend_env"] == "auto"
    assert b.package_version("0.0.1") == "0.0.1"
    fake.add("_build_info", 'BUILT_FOR = "cuda"\nCOMPILED_BACKENDS = ("cuda",)\n')
    version = f"{random.randint(1, 9)}.{random.randint(0, 99)}.{random.randint(0, 99)}"
    dist_info = tmp_path / "deepinfer_fakepkg-0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: deepinfer-fakepkg\nVersion: {version}\n")
    importlib.invalidate_caches()
    assert b.build_info()["built_for"] == "cuda" and b.build_info()["compiled_backends"] == ["cuda"]
    assert b.package_version("0.0.1") == version  # installed: the distribution's version, not the fallback
