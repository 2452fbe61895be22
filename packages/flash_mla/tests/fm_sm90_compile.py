"""Compile the split-KV kernels (fused, chunked and deferred, BF16 and FP8 caches, the benchmark's configs) for sm_90a
without a GPU and report shared memory, registers and spills (stack bytes) of each.

Run by test_sm90_compile.py (`--quick`: three variants) in a subprocess with TRITON_INTERPRET unset; run it by
hand for all (`PYTHONPATH=packages/flash_mla/src python packages/flash_mla/tests/fm_sm90_compile.py`).
One line per variant:
"OK name smem=B regs=R stack=S cp_async=N" or "FAIL name: why"; exit status 1 when any failed to compile.
Pointer and stride arguments get the 16-divisibility the JIT gives them at V4 shapes (without it Triton does not
vectorise the row gather and emits no cp.async). A variant whose shared memory exceeds the SM's 227 KiB is
reported (the launcher drops a stage at run time). The installed Triton may be newer than the GPU's (3.6).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deepinfer.flash_mla.backends.cuda import triton_split_attn as fused
from deepinfer.flash_mla.backends.cuda import triton_split_chunked as chunked
from deepinfer.flash_mla.backends.cuda import triton_split_deferred as deferred

T = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 227 * 1024
_INTS = ("H", "n_kv", "n_ex", "topk", "topk_ex", "num_splits", "tiles_per_split")
_STRIDES = ("stride_qt", "stride_qh", "stride_kv", "stride_it", "stride_ex", "stride_et", "stride_ot", "stride_oh")
FAILED: list[str] = []


def signature(fp8: bool) -> dict[str, str]:
    kv = "*u8" if fp8 else "*bf16"  # the extra cache stays BF16 (EX_FP8=False)
    s = {
        "q_ptr": "*bf16",
        "kv_ptr": kv,
        "kv16_ptr": "*bf16",
        "idx_ptr": "*i32",
        "ex_kv_ptr": "*bf16",
        "ex16_ptr": "*bf16",
    }
    s.update(ex_idx_ptr="*i32", sink_ptr="*fp32", out_ptr="*bf16", lse_ptr="*fp32", part_o_ptr="*fp32")
    s.update(part_lse_ptr="*fp32", qk_scale="fp32", stride_lt="i32", stride_lh="i32")
    s.update({n: "i32" for n in _INTS + _STRIDES})
    return s


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) from cuobjdump --dump-resource-usage (Triton's bundled one)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    reg, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    return (int(reg.group(1)) if reg else -1), (int(stack.group(1)) if stack else -1)


def go(name: str, fn, fp8: bool, cfg: tuple[int, int, int, int], split: bool) -> None:  # noqa: ANN001
    block_h, block_n, warps, stages = cfg
    cx = dict(D=512, BLOCK_H=block_h, BLOCK_N=block_n, NUM_HB=64 // block_h, SPLIT=split, HAS_EXTRA=True)
    cx.update(HAS_SINK=True, KV_FP8=fp8, EX_FP8=False, DOT_FP32=False, BF16_RNE=False)
    sig = signature(fp8)
    div16 = [n for n, t in sig.items() if t.startswith("*")] + list(_STRIDES)
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
    sig.update({k: "constexpr" for k in cx})
    try:
        c = triton.compile(
            ASTSource(fn, sig, constexprs=cx, attrs=attrs), target=T, options={"num_warps": warps, "num_stages": stages}
        )
    except Exception as e:  # noqa: BLE001 (report every variant)
        FAILED.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}", flush=True)
        return
    regs, stack = resources(c.asm["cubin"])
    smem = c.metadata.shared
    note = " over-smem" if smem > SMEM_LIMIT else ""
    ptx = c.asm["ptx"]
    print(f"OK {name} smem={smem} regs={regs} stack={stack} cp_async={ptx.count('cp.async.c')}{note}", flush=True)


QUICK = [  # the CPU test's subset (time): the two new kernels on FP8 rows and BF16, split and not
    ("chunked", True, (64, 64, 8, 2), True),
    ("deferred", False, (64, 32, 8, 3), False),
    ("deferred", True, (64, 32, 8, 3), True),
]


def main() -> int:
    kernels = {
        "fused": fused._split_attn_kernel,
        "chunked": chunked._split_chunked_kernel,
        "deferred": deferred._split_deferred_kernel,
    }
    if sys.argv[1:] == ["--quick"]:
        for kname, fp8, cfg, split in QUICK:
            go(f"{kname} fp8={fp8} cfg={cfg} split={split}", kernels[kname], fp8, cfg, split)
        return 1 if FAILED else 0
    which = sys.argv[1:] or list(kernels)
    for kname, fn in kernels.items():
        if kname not in which:
            continue
        for fp8 in (False, True):
            default = fused.default_split_config(64, 512, fp8=fp8, kernel=kname)
            for cfg in dict.fromkeys([default, (64, 64, 8, 2), (64, 32, 8, 3), (64, 32, 8, 2), (64, 16, 8, 4)]):
                go(f"{kname} fp8={fp8} cfg={cfg} split=False", fn, fp8, cfg, False)
        go(f"{kname} fp8=True cfg={(64, 64, 8, 2)} split=True", fn, True, (64, 64, 8, 2), True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
