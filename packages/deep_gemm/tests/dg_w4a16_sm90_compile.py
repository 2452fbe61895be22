"""Compile the W4A16 kernel-3 variants (and kernel 1's decode default, for comparison) for sm_90a without a GPU.

Run by test_dg_w4a16_v3.py in a subprocess with TRITON_INTERPRET unset (the interpreter makes `triton.jit`
functions the compiler does not take). Per variant: Triton -> PTX -> cubin with the divisibility-16
specialisation a GPU launch gets, then Triton's `cuobjdump -res-usage` for the registers and the stack frame
(spills). Prints "OK name regs=R spill=S lop3=L mul=M ftz=F" or "FAIL name: why"; exit status 1 when any
variant fails, an asm variant spills, or any has an .ftz multiply (the dequantisers need subnormals).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deepinfer.deep_gemm.backends.cuda import triton_fp4_grouped as k1
from deepinfer.deep_gemm.backends.cuda import triton_fp4_grouped_v2 as k2
from deepinfer.deep_gemm.backends.cuda import triton_fp4_grouped_v3 as k3
from deepinfer.deep_gemm.backends.cuda import w4a16_configs as cfgs

TARGET = GPUTarget("cuda", 90, 32)
FAILED: list[str] = []
SIG = {
    "a_ptr": "*i32", "b_ptr": "*u8", "s_ptr": "*u8", "offs_ptr": "*i32", "out_ptr": "*bf16",
    "M": "i32", "N": "i32", "K": "i32",
    "stride_am": "i32", "stride_bg": "i32", "stride_bn": "i32", "stride_sg": "i32", "stride_sn": "i32",
    "stride_om": "i32",
}  # fmt: skip


def cubin_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack-frame bytes = spills) of a cubin from Triton's bundled `cuobjdump -res-usage`
    ((-1, -1) when it is absent; the system ptxas may be older than the PTX Triton emits)."""
    exe = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not exe.exists():
        return -1, -1
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "k.cubin"
        path.write_bytes(cubin)
        log = subprocess.run([str(exe), "-res-usage", str(path)], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", log)
    stack = re.search(r"STACK:(\d+)", log)  # spills live in the stack frame (LOCAL counts .local variables)
    return int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else -1


def go(name: str, fn, sig: dict, cx: dict, warps: int, stages: int) -> None:  # noqa: ANN001
    sig = dict(sig)
    sig.update({k: "constexpr" for k in cx})
    try:
        opts = {"num_warps": warps, "num_stages": stages}
        # What a GPU launch specialises: pointers and ints divisible by 16 (M is do_not_specialize; G is 256)
        div = {(i,): [["tt.divisibility", 16]] for i, (k, v) in enumerate(sig.items()) if v != "constexpr" and k != "M"}
        src = ASTSource(fn, sig, constexprs=cx, attrs=div)
        asm = triton.compile(src, target=TARGET, options=opts).asm
        ptx = asm["ptx"]
    except Exception as e:  # noqa: BLE001 (report every variant)
        FAILED.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}", flush=True)
        return
    regs, spill = cubin_usage(asm["cubin"])
    ftz = len(re.findall(r"mul\.(?:rn\.)?ftz", ptx))
    print(f"OK {name} regs={regs} spill={spill} lop3={ptx.count('lop3.b32')} mul={ptx.count('mul.rn.bf16x2')} "
          f"ftz={ftz}", flush=True)  # fmt: skip
    if (spill > 0 and "asm=True" in name) or ftz:  # the asm path is what runs on the GPU; asm=False is a fallback
        FAILED.append(name)


def main() -> int:
    """Default (the CPU test, kept short): kernel-3 configs with the asm dequantiser, V3_DECODE also with the
    integer one, and the reduce kernel. --all: both dequantisers everywhere plus kernels 1 and 2 (report)."""
    full = "--all" in sys.argv
    decode = [c for c in cfgs.SWEEP["decode"] if c.kernel == 3]
    for cfg in decode:
        for asm in (True, False) if full or cfg == cfgs.V3_DECODE else (True,):
            cx = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "SPLIT_K": cfg.split_k,
                  "EVEN_N": True, "FOLD": cfg.fold, "DOT_FP32": False, "USE_ASM": asm}  # fmt: skip
            sig = dict(SIG, ws_ptr="*fp32", stride_wk="i32")
            sig = {k: sig[k] for k in [*list(SIG)[:5], "ws_ptr", *list(SIG)[5:], "stride_wk"]}  # kernel's order
            go(f"v3 {cfg.name} asm={asm}", k3._w4a16_grouped_kernel_v3, sig, cx, cfg.num_warps, cfg.num_stages)
    for cfg in (c for c in cfgs.SWEEP["prefill"] if c.kernel == 2 and full):  # registers / spills: report only
        cx = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "EVEN_N": True, "DOT_FP32": False, "USE_ASM": True}
        sig = dict(SIG, a_ptr="*bf16", s_ptr="*i32")
        go(f"v2 {cfg.name} (report only)", k2._w4a16_grouped_kernel_v2, sig, cx, cfg.num_warps, cfg.num_stages)
    d = cfgs.DECODE
    cx = {"BLOCK_M": d.block_m, "BLOCK_N": d.block_n, "BLOCK_K": d.block_k, "DOT_FP32": False, "USE_ASM": True}
    if full:
        go(f"v1 {d.name} asm=True", k1._w4a16_grouped_kernel, SIG, cx, d.num_warps, d.num_stages)
    rsig = {"ws_ptr": "*fp32", "out_ptr": "*bf16", "offs_ptr": "*i32", "G": "i32", "M": "i32", "N": "i32",
            "stride_wk": "i32", "stride_om": "i32"}  # fmt: skip
    go("splitk reduce", k3._splitk_reduce, rsig, {"SPLIT_K": 2, "BLOCK_R": 16, "BLOCK_C": 256}, 4, 1)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
