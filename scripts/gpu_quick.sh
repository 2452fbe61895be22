#!/usr/bin/env bash
# Session runner for the device tool: editable CUDA installs, then parts run in lanes (one lane per GPU, in
# parallel), then parts that need every GPU. Logs and JSON go to $WORK (default build/gpu-quick) and are packed
# into $OUT/all.tgz (the device tool brings back at most 8 files; snapshots after every part in
# $OUT/lane-*.tgz / after.tgz survive a run cut off at its limit); summaries stream to stdout.
#
#   bash scripts/gpu_quick.sh "<lane0 parts>" ["<lane1 parts>"] ["<parts after both lanes>"]
#
# Parts (space-separated inside a lane; ':' joins a part's arguments with commas):
#   tests:<name>:<path,path,...>   pytest -m "gpu or multigpu" over the paths -> tests-<name>.log
#   engine                         benchmarks/bench_engine_v4flash.py -> engine.json / engine.log
#   profile                        benchmarks/profile_engine_decode.py (batch 32) -> profile.json / profile.log
#   bench:<pkg>                    packages/<pkg>/benchmarks/bench_<pkg>.py -> bench-<pkg>.json / .log
#   ncu:<target>                   Nsight Compute (--set full, clocks left alone) on benchmarks/ncu_targets.py <target>
#                                  -> ncu-<target>.ncu-rep + its details / raw / per-SASS-line (source) exports
#   script:<name>:<path>[:<args>]  another benchmark script (or bench_<pkg>.py with arguments, "+"-separated in
#                                  <args>), run with --out <name>.json -> <name>.json / .log
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
WORK=${WORK:-build/gpu-quick}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)

# Packages build in parallel (compiled CUDA C++, e.g. CUTLASS instantiations, dominates); CUTLASS headers come from
# build/third_party/cutlass_include when the caller carried that folder.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[[ -d build/third_party/cutlass_include ]] && export CUTLASS_INCLUDE_DIR=$PWD/build/third_party/cutlass_include
TI=$(date +%s)
for p in tile_kernels deep_select flash_mla deep_gemm deep_ep engine kernelkit; do
  dev=cuda  # DI_CPU_PKGS="pkg ...": build those without compiled sources (their Triton paths still run)
  [[ " ${DI_CPU_PKGS:-} " == *" $p "* ]] && dev=cpu
  (DEEPINFER_DEVICE=$dev python3 -m pip install -q --no-build-isolation --no-deps -e "packages/$p" \
    >"$WORK/install-$p.log" 2>&1 || echo "install $p failed: $(tail -5 "$WORK/install-$p.log")") &
done
wait
echo "== installed in $(($(date +%s) - TI)) s; compiled: $(python3 -c 'import importlib as i
print([p for p in ("tile_kernels","deep_select","flash_mla","deep_gemm","deep_ep")
       if i.import_module(f"deepinfer.{p}._build_info").COMPILED_BACKENDS])' 2>&1 | tail -1)"

part() {  # part <spec>: run one part, print a short summary (with its wall seconds)
  local t0=$(date +%s)
  _part "$@"
  echo "   ($1: $(($(date +%s) - t0)) s)"
}

_part() {
  local spec=$1 kind rest name paths pkg
  kind=${spec%%:*}
  rest=${spec#*:}
  case "$kind" in
    tests)
      name=${rest%%:*}
      paths=${rest#*:}
      timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -m "gpu or multigpu" -p no:cacheprovider ${paths//,/ } \
        >"$WORK/tests-$name.log" 2>&1
      echo "== tests $name rc=$?"
      grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$WORK/tests-$name.log" | tail -25 ;;
    engine)
      timeout 420 python3 benchmarks/bench_engine_v4flash.py --out "$WORK/engine.json" >"$WORK/engine.log" 2>&1
      echo "== engine rc=$?"
      grep -E "^(hf|deepinfer) b=" "$WORK/engine.log" | cut -c1-110 ;;
    profile)
      timeout 300 python3 benchmarks/profile_engine_decode.py --batches 32 --out "$WORK/profile.json" 2>&1 |
        grep -v -E "^USDT|Warning|warn" >"$WORK/profile.log"
      echo "== profile rc=$?"
      grep "== b=" "$WORK/profile.log" | cut -c1-300 ;;
    bench)
      pkg=$rest
      timeout 300 python3 "packages/$pkg/benchmarks/bench_$pkg.py" --out "$WORK/bench-$pkg.json" \
        >"$WORK/bench-$pkg.log" 2>&1
      echo "== bench $pkg rc=$?"
      tail -2 "$WORK/bench-$pkg.log" | cut -c1-200 ;;
    ncu)
      local ncu rep="$WORK/ncu-$rest"
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      timeout 300 "$ncu" --clock-control none --nvtx --nvtx-include "prof/" --launch-count 4 --set full \
        --import-source no -f -o "$rep" python3 benchmarks/ncu_targets.py "$rest" >"$rep.log" 2>&1
      echo "== ncu $rest rc=$?"
      "$ncu" -i "$rep.ncu-rep" --page details >"$rep-details.txt" 2>&1
      "$ncu" -i "$rep.ncu-rep" --page raw --csv >"$rep-raw.csv" 2>&1
      "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep-sass.csv" 2>&1
      grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput" "$rep-details.txt" | head -12 ;;
    script)  # script:<name>:<path>[:<args>]: a benchmark script run with --out <name>.json (args: "+" -> " ")
      name=${rest%%:*}
      rest=${rest#*:}
      local path=${rest%%:*} args=""
      [[ "$rest" == *:* ]] && args=${rest#*:}
      timeout 300 python3 "$path" ${args//+/ } --out "$WORK/$name.json" >"$WORK/$name.log" 2>&1
      echo "== script $name rc=$?"
      tail -2 "$WORK/$name.log" | cut -c1-200 ;;
    *) echo "== unknown part $spec" ;;
  esac
}

pack() {  # pack <name>: snapshot every log and JSON so far into $OUT/<name>.tgz (a run cut off keeps them)
  [[ -n "${OUT:-}" ]] && tar czf "$OUT/$1.tgz.tmp" -C "$WORK" . 2>/dev/null && mv "$OUT/$1.tgz.tmp" "$OUT/$1.tgz"
  return 0
}

lane() {  # lane <gpu> <name> <parts...>: run parts in order on one GPU, output to lane-<name>.out
  local gpu=$1 name=$2
  shift 2
  # tee: the summaries reach stdout as they happen, so a run cut off at its time limit still reports them
  for spec in "$@"; do CUDA_VISIBLE_DEVICES=$gpu part "$spec"; pack "lane-$name"; done 2>&1 | tee "$WORK/lane-$name.out"
}

T0=$(date +%s)
read -r -a L0 <<<"${1:-}"
read -r -a L1 <<<"${2:-}"
read -r -a AFTER <<<"${3:-}"
if ((NGPU >= 2)); then
  lane 0 a "${L0[@]}" &
  lane 1 b "${L1[@]}" &
  wait
else  # one GPU: the lanes run one after the other
  lane 0 a "${L0[@]}"
  lane 0 b "${L1[@]}"
fi
for spec in "${AFTER[@]}"; do part "$spec"; pack after; done
echo "== done in $(($(date +%s) - T0)) s on $NGPU GPU(s)"
if [[ -n "${OUT:-}" ]]; then tar czf "$OUT/all.tgz" -C "$WORK" . && rm -f "$OUT"/lane-*.tgz "$OUT/after.tgz" &&
  echo "packed $OUT/all.tgz"; fi
