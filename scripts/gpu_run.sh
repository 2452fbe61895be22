#!/usr/bin/env bash
# The one script for the H200 machine (offline: no package registry). From the repository root:
#   bash scripts/gpu_run.sh [tests|bench|all] [--wheels DIR] [--no-install] [--dry-run] [PKG ...]
#
#   tests        pytest -m gpu (and multigpu when 2+ GPUs) over the selected packages + tests/, JUnit XML
#   bench        each selected package's benchmarks/bench_<pkg>.py --out JSON, then benchmarks/bench_*.py (engine)
#   all          both (default)
#   PKG          tile_kernels deep_select flash_mla deep_gemm deep_ep engine (default: all of them)
#   --wheels DIR wheels for what the image lacks (tokenizers, jinja2, ...): installed with
#                --no-index --no-deps into /tmp/site, put on PYTHONPATH. Default: .whl/ when it exists.
#   --no-install skip the editable installs (already done on this machine)
#   --dry-run    print the commands instead of running them
#
# Packages are installed editable with DEEPINFER_DEVICE=cuda (builds csrc/cuda/ into _C). Results go to
# $OUT (default build/gpu-out): junit-gpu.xml, bench-<pkg>.json, logs/; every benchmark JSON is also copied
# to benchmarks/results/<date>-<name>.json. Each benchmark runs as `python <script> --out <json>` (deep_ep's under
# torchrun, one process per GPU), with a timeout (BENCH_TIMEOUT seconds).
# A failing part does not stop the others; the exit status is non-zero when any part failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ALL_PKGS=(tile_kernels deep_select flash_mla deep_gemm deep_ep engine)
PART=all WHEELS="" INSTALL=1 DRY=0 PKGS=()
while (($#)); do
  case "$1" in
    tests | bench | all) PART=$1 ;;
    --wheels) WHEELS=${2:?--wheels needs a directory}; shift ;;
    --no-install) INSTALL=0 ;;
    --dry-run) DRY=1 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *)
      if [[ " ${ALL_PKGS[*]} " != *" $1 "* ]]; then
        echo "gpu_run.sh: unknown argument '$1' (expected tests|bench|all, an option, or one of: ${ALL_PKGS[*]})" >&2
        exit 2
      fi
      PKGS+=("$1") ;;
  esac
  shift
done
((${#PKGS[@]})) || PKGS=("${ALL_PKGS[@]}")
[[ -n "$WHEELS" || ! -d .whl ]] || WHEELS=.whl

OUT="${OUT:-$PWD/build/gpu-out}"  # build/ is gitignored
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
PY="${PYTHON:-python3}"
mkdir -p "$OUT/logs" benchmarks/results
# NVLink multicast must stay off on these machines (reference/h200-ceilings.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PIP_NO_INDEX=1
FAILED=()
T0=$(date +%s)

# run <name> <cmd...>: run (or print) a command, log it to $OUT/logs/<name>.log, record failure.
run() {
  local name=$1
  shift
  echo "== [$(($(date +%s) - T0))s] $name: $*"
  ((DRY)) && return 0
  "$@" 2>&1 | tee "$OUT/logs/$name.log"
  local rc=${PIPESTATUS[0]}
  if ((rc == 5)) && [[ "$1" == "$PY" && "$*" == *pytest* ]]; then
    echo "== $name: no tests collected (exit 5); nothing to run yet"
  elif ((rc != 0)); then
    FAILED+=("$name (exit $rc)")
  fi
  return 0
}

install_wheels() {
  [[ -n "$WHEELS" ]] || return 0
  [[ -d "$WHEELS" ]] || { echo "gpu_run.sh: --wheels '$WHEELS' is not a directory" >&2; exit 2; }
  run wheels "$PY" -m pip install --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
}

install_packages() {
  local pkg
  for pkg in "${PKGS[@]}" kernelkit; do
    run "install-$pkg" env DEEPINFER_DEVICE=cuda "$PY" -m pip install --no-build-isolation --no-deps -e "packages/$pkg"
  done
  ((DRY)) || "$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda,
        "gpus", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'
}

run_tests() {
  local paths=() pkg marker=gpu
  for pkg in "${PKGS[@]}"; do [[ -d "packages/$pkg/tests" ]] && paths+=("packages/$pkg/tests"); done
  paths+=(tests)
  local ngpu
  ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  ((ngpu >= 2)) && marker="gpu or multigpu"
  run tests "$PY" -m pytest -q -m "$marker" --junitxml="$OUT/junit-gpu.xml" "${paths[@]}"
}

# copy_result <json> <name>: keep a benchmark JSON in $OUT and in the repo's recorded results.
copy_result() {
  [[ -f "$1" ]] || return 0
  cp "$1" "benchmarks/results/$STAMP-$2.json"
  [[ "$1" == "$OUT/$2.json" ]] || cp "$1" "$OUT/$2.json"
}

# Package benchmarks: packages/<pkg>/benchmarks/bench_<pkg>.py runs as `python <script> --out <json>` (deep_ep's
# under torchrun with one process per GPU when there are two or more). Root benchmarks: benchmarks/bench_*.py.
run_benchmarks() {
  local pkg script name ngpu
  ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  for pkg in "${PKGS[@]}"; do
    [[ "$pkg" != engine ]] || continue  # the engine's benchmarks are the root ones below
    for script in packages/"$pkg"/benchmarks/bench_"$pkg".py; do
      [[ -f "$script" ]] || { echo "== $pkg: no benchmark script ($script)"; continue; }
      name="bench-$pkg"
      if [[ "$pkg" == deep_ep ]]; then
        if ((ngpu < 2)); then echo "== $name: needs 2 GPUs, found $ngpu; skipped"; continue; fi
        run "$name" timeout "${BENCH_TIMEOUT:-300}" "$PY" -m torch.distributed.run --standalone \
          --nproc-per-node "$ngpu" "$script" --out "$OUT/$name.json"
      else
        run "$name" timeout "${BENCH_TIMEOUT:-300}" "$PY" "$script" --out "$OUT/$name.json"
      fi
      copy_result "$OUT/$name.json" "$name"
    done
  done
  [[ " ${PKGS[*]} " == *" engine "* ]] || return 0
  for script in benchmarks/bench_*.py; do
    [[ -f "$script" ]] && grep -q '__main__' "$script" || continue
    name="e2e-$(basename "$script" .py)"
    run "$name" timeout "${BENCH_TIMEOUT:-600}" "$PY" "$script" --out "$OUT/$name.json"
    copy_result "$OUT/$name.json" "$name"
  done
}

install_wheels
((INSTALL)) && install_packages
[[ "$PART" == bench ]] || run_tests
[[ "$PART" == tests ]] || run_benchmarks

echo "== done in $(($(date +%s) - T0))s; results in $OUT"
if ((${#FAILED[@]})); then
  printf '== FAILED: %s\n' "${FAILED[@]}" >&2
  exit 1
fi
