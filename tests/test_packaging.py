"""Packaging: package metadata agrees, wheels build per device flag, installed packages import alone.

The wheel tests run real `pip wheel --no-build-isolation` builds (scikit-build-core + CMake) into a
temporary folder; they need scikit-build-core, cmake and ninja (installed by .ci/run).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL_PKGS = ("tile_kernels", "deep_select", "flash_mla", "deep_gemm", "deep_ep")
ALL_PKGS = (*KERNEL_PKGS, "engine", "kernelkit")


def _dist(pkg: str) -> str:
    return {"engine": "deepinfer", "kernelkit": "deepinfer-kernelkit"}.get(pkg, "deepinfer-" + pkg.replace("_", "-"))


def _pyproject(pkg: str) -> dict:
    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())


def test_backend_module_is_identical_in_every_kernel_package() -> None:
    texts = {p: (ROOT / f"packages/{p}/src/deepinfer/{p}/_backend.py").read_text() for p in KERNEL_PKGS}
    assert len(set(texts.values())) == 1, "copy packages/tile_kernels/.../_backend.py to the other packages"


def test_ascend_core_is_identical_everywhere():
    """backends/ascend/_core.py (dispatch, lazy torch_npu, fallback rules) is one file copied per package, like
    _backend.py, so each wheel installs alone."""
    texts = {p: (ROOT / f"packages/{p}/src/deepinfer/{p}/backends/ascend/_core.py").read_text() for p in KERNEL_PKGS}
    assert len(set(texts.values())) == 1, "copy packages/tile_kernels/.../backends/ascend/_core.py to the others"


@pytest.mark.parametrize("pkg", ALL_PKGS)
def test_pyproject_agrees_with_layout(pkg: str) -> None:
    meta = _pyproject(pkg)
    assert meta["project"]["name"] == _dist(pkg)
    assert meta["build-system"]["build-backend"] == "scikit_build_core.build"
    assert (ROOT / "packages" / pkg / meta["project"]["readme"]).is_file()
    assert not (ROOT / f"packages/{pkg}/src/deepinfer/__init__.py").exists(), "PEP 420: no deepinfer/__init__.py"
    if pkg == "kernelkit":
        return
    skb = meta["tool"]["scikit-build"]
    assert skb["wheel"]["packages"] == ["src/deepinfer"]
    assert skb["cmake"]["define"]["DEEPINFER_DEVICE"] == {"env": "DEEPINFER_DEVICE", "default": "auto"}
    assert (ROOT / "packages" / pkg / "CMakeLists.txt").is_file()


@pytest.mark.parametrize("pkg", KERNEL_PKGS)
def test_source_version_matches_pyproject(pkg: str) -> None:
    init = (ROOT / f"packages/{pkg}/src/deepinfer/{pkg}/__init__.py").read_text()
    assert f'package_version("{_pyproject(pkg)["project"]["version"]}")' in init


def test_engine_depends_on_every_kernel_package_and_declares_the_cli() -> None:
    meta = _pyproject("engine")["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in meta["dependencies"]}
    wanted = {_dist(p) for p in KERNEL_PKGS} | {"torch", "safetensors", "tokenizers", "huggingface_hub"}
    assert wanted | {"tqdm", "jinja2", "numpy"} <= names
    assert meta["scripts"] == {"deepinfer": "deepinfer.engine.cli:main"}


@pytest.mark.parametrize("pkg", KERNEL_PKGS)
def test_source_tree_package_reports_reference_on_cpu(pkg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = __import__(f"deepinfer.{pkg}", fromlist=["backend"])
    monkeypatch.delenv(f"DEEPINFER_{pkg.upper()}_BACKEND", raising=False)
    assert mod.backend("cpu") == "reference"
    info = mod.build_info()
    assert info["package"] == _dist(pkg) and info["version"] == mod.__version__
    assert info["built_for"] in ("source", "cpu", "cuda", "ascend")
    assert {"backend", "build_info"} <= set(mod.__all__)


def _run(cmd: list[str], env: dict[str, str], cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _pip_wheel(out: pathlib.Path, device: str, pkgs: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEEPINFER_DEVICE": device}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-q"]
    cmd += ["-w", str(out / "wheels"), "-C", f"build-dir={out}/build/{{name}}"]
    return _run(cmd + [str(ROOT / "packages" / p) for p in pkgs], env)


@pytest.fixture(scope="module")
def cpu_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """Every package built once with DEEPINFER_DEVICE=cpu: {pkg: wheel path}."""
    out = tmp_path_factory.mktemp("wheels")
    res = _pip_wheel(out, "cpu", ALL_PKGS)
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = {}
    for pkg in ALL_PKGS:
        found = list((out / "wheels").glob(_dist(pkg).replace("-", "_") + "-*.whl"))
        assert len(found) == 1, f"{pkg}: {found}"
        wheels[pkg] = found[0]
    return wheels


@pytest.mark.parametrize("pkg", (*KERNEL_PKGS, "engine"))
def test_cpu_wheel_records_device_and_has_no_namespace_init(pkg: str, cpu_wheels: dict[str, pathlib.Path]) -> None:
    with zipfile.ZipFile(cpu_wheels[pkg]) as zf:
        names = set(zf.namelist())
        info = zf.read(f"deepinfer/{pkg}/_build_info.py").decode()
    assert 'BUILT_FOR = "cpu"' in info and "COMPILED_BACKENDS = ()" in info
    assert "deepinfer/__init__.py" not in names
    assert f"deepinfer/{pkg}/__init__.py" in names
    assert not any(n.startswith(("deepinfer/tests", f"deepinfer/{pkg}/tests")) or "__pycache__" in n for n in names)
    assert {n.split("/")[1] for n in names if n.startswith("deepinfer/")} == {pkg}


def test_engine_wheel_installs_the_cli(cpu_wheels: dict[str, pathlib.Path]) -> None:
    with zipfile.ZipFile(cpu_wheels["engine"]) as zf:
        eps = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "deepinfer = deepinfer.engine.cli:main" in zf.read(eps).decode()


def test_kernelkit_wheel_is_pure_and_outside_the_namespace(cpu_wheels: dict[str, pathlib.Path]) -> None:
    assert cpu_wheels["kernelkit"].name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(cpu_wheels["kernelkit"]) as zf:
        names = zf.namelist()
    assert "kernelkit/__init__.py" in names and not any(n.startswith("deepinfer/") for n in names)


@pytest.mark.parametrize("pkg", KERNEL_PKGS)
def test_installed_wheel_imports_alone(pkg: str, cpu_wheels: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    # Unpacking a pure wheel is installing it. `python -S` skips .pth files, so editable installs of
    # DeepInfer elsewhere cannot redirect the import; the site-packages holding torch comes after ours.
    with zipfile.ZipFile(cpu_wheels[pkg]) as zf:
        zf.extractall(tmp_path / "site")
    torch_site = pathlib.Path(importlib.util.find_spec("torch").origin).parents[1]
    code = (
        f"import sys, json, deepinfer.{pkg} as m; i = m.build_info(); "
        f"assert i['path'].startswith({str(tmp_path)!r}), i; "
        f"others = [n for n in sys.modules if n.startswith('deepinfer.') and not n.startswith('deepinfer.{pkg}')]; "
        "assert not others, others; print(json.dumps([i['built_for'], m.__version__]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPINFER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(torch_site)])
    res = _run([sys.executable, "-S", "-c", code], env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ['["cpu",', f'"{_pyproject(pkg)["project"]["version"]}"]']


@pytest.mark.parametrize("bad", ["gpu", "CUDA"])
def test_bad_device_fails_the_build_naming_it(bad: str, tmp_path: pathlib.Path) -> None:
    res = _pip_wheel(tmp_path, bad, ("deep_select",))
    assert res.returncode != 0
    assert f"DEEPINFER_DEVICE must be one of auto|cuda|ascend|cpu, got '{bad}'" in res.stdout + res.stderr
    assert not list((tmp_path / "wheels").glob("*.whl"))


def test_root_cmake_configures_every_package(tmp_path: pathlib.Path) -> None:
    res = _run(["cmake", "-S", str(ROOT), "-B", str(tmp_path), "-DDEEPINFER_DEVICE=cpu"], dict(os.environ))
    assert res.returncode == 0, res.stdout + res.stderr
    for pkg in (*KERNEL_PKGS, "engine"):
        assert 'BUILT_FOR = "cpu"' in (tmp_path / "packages" / pkg / "_build_info.py").read_text()


def test_readme_has_the_one_line_test_command_that_ci_runs() -> None:
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("python -m pytest ")]
    assert lines == ['python -m pytest -q -m "not gpu and not multigpu"']
    ci = (ROOT / ".ci/run").read_text()
    assert "grep -E '^python -m pytest ' README.md" in ci and "export TRITON_INTERPRET=1" in ci
    assert "bash scripts/install_dev.sh && deepinfer generate --prompt" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("script", [".ci/run", "scripts/gpu_run.sh", "scripts/install_dev.sh"])
def test_scripts_parse_and_are_executable(script: str) -> None:
    path = ROOT / script
    assert os.access(path, os.X_OK), f"{script}: chmod +x"
    res = _run(["bash", "-n", str(path)], dict(os.environ))
    assert res.returncode == 0, res.stderr


def test_gpu_script_dry_run_lists_every_part(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    res = _run(["bash", "scripts/gpu_run.sh", "all", "--dry-run", "deep_gemm"], env)
    assert res.returncode == 0, res.stderr
    assert "DEEPINFER_DEVICE=cuda" in res.stdout and "-e packages/deep_gemm" in res.stdout
    assert "-e packages/kernelkit" in res.stdout and "-e packages/flash_mla" not in res.stdout
    assert f"--junitxml={tmp_path}/junit-gpu.xml" in res.stdout
    bad = _run(["bash", "scripts/gpu_run.sh", "nonsense"], env)
    assert bad.returncode == 2 and "unknown argument 'nonsense'" in bad.stderr
