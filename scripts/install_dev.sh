#!/usr/bin/env bash
# Developer setup from a checkout: runtime dependencies, build tools, then every DeepInfer package
# installed editable (edits take effect without reinstalling), so `deepinfer generate` works.
#
# Usage: bash scripts/install_dev.sh [--test] [--regular]
#   --test      also install the test dependencies (transformers>=5.14, pytest, hypothesis, triton, accelerate)
#   --regular   real (non-editable) installs instead of editable ones
# Environment:
#   PYTHON            interpreter to install into (default python3)
#   DEEPINFER_DEVICE  auto|cuda|ascend|cpu, what to compile (default auto: CUDA when nvcc is found)
#   DEEPINFER_TORCH   pip requirement used only when torch is missing (default torch==2.13.0)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
EDITABLE=(-e)
WITH_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TESTS=1 ;;
    --regular) EDITABLE=() ;;
    *)
      echo "install_dev.sh: unknown argument '$arg' (expected --test or --regular)" >&2
      exit 2
      ;;
  esac
done

export DEEPINFER_DEVICE="${DEEPINFER_DEVICE:-auto}" PIP_DISABLE_PIP_VERSION_CHECK=1
PACKAGES=(tile_kernels deep_select flash_mla deep_gemm deep_ep engine kernelkit)
RUNTIME=(safetensors tokenizers huggingface_hub tqdm jinja2 numpy)
BUILD=(scikit-build-core cmake ninja pybind11)
TESTS=("transformers>=5.14" pytest hypothesis triton accelerate)

# Keep an existing torch (a CUDA build on a GPU machine); install one only when there is none.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install "${DEEPINFER_TORCH:-torch==2.13.0}"
fi
deps=("${RUNTIME[@]}" "${BUILD[@]}")
[[ "$WITH_TESTS" == 1 ]] && deps+=("${TESTS[@]}")
"$PY" -m pip install "${deps[@]}"

for pkg in "${PACKAGES[@]}"; do
  echo "== packages/$pkg (DEEPINFER_DEVICE=$DEEPINFER_DEVICE)"
  "$PY" -m pip install -q --no-build-isolation --no-deps "${EDITABLE[@]}" "packages/$pkg"
done
# Fail on DeepInfer's own unmet requirements only; conflicts among other packages of the environment (e.g. a fresh
# venv's old setuptools under torch) are reported, not fatal.
if ! check=$("$PY" -m pip check 2>&1); then
  if grep -qi deepinfer <<<"$check"; then
    echo "$check" >&2
    exit 1
  fi
  echo "pip check (not DeepInfer's packages): $check" >&2
fi

# pyenv only sees new console scripts after a rehash; anywhere else, say where `deepinfer` went.
command -v pyenv >/dev/null && pyenv rehash || true
if ! command -v deepinfer >/dev/null; then
  bindir=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  echo "installed; add $bindir to PATH to run 'deepinfer' (or use: $PY -m deepinfer.engine)" >&2
fi
"$PY" - <<'EOF'
import importlib
for name in ("tile_kernels", "deep_select", "flash_mla", "deep_gemm", "deep_ep"):
    mod = importlib.import_module(f"deepinfer.{name}")
    info = mod.build_info()
    print(f"deepinfer.{name} {mod.__version__}: built for {info['built_for']}, default backend {mod.backend()}")
EOF
