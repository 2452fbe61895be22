"""Compile the W4A8 kernel for sm_90a without a GPU: the decode and prefill defaults with the asm dequantiser,
the decode default with the integer one too (--all: every swept config).

Run by test_dg_w4a8.py in a subprocess with TRITON_INTERPRET unset. Prints "OK name regs=R spill=S lop3=L
wgmma=W ftz=F" or "FAIL name: why" per variant; exit status 1 when one fails to compile, has an .ftz instruction or
a decode config spills
(prefill spills are reported only: see w4a8_configs.py).
"""

from __future__ import annotations

import re
import sys

import triton
from dg_w4a16_sm90_compile import cubin_usage
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deepinfer.deep_gemm.backends.cuda import triton_fp4_fp8_grouped as k8
from deepinfer.deep_gemm.backends.cuda import w4a8_configs as cfgs

TARGET = GPUTarget("cuda", 90, 32)
SIG = {
    "a_ptr": "*fp8e4nv", "sa_ptr": "*fp32", "b_ptr": "*u8", "s_ptr": "*i32", "offs_ptr": "*i32", "out_ptr": "*bf16",
    "ws_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
    "stride_am": "i32", "stride_sam": "i32", "stride_bg": "i32", "stride_bn": "i32", "stride_sg": "i32",
    "stride_sn": "i32", "stride_om": "i32", "stride_wk": "i32",
}  # fmt: skip


def compile_one(cfg: cfgs.W4A8Config, asm: bool, spill_ok: bool = False) -> bool:
    name = f"w4a8 {cfg.name} asm={asm}"
    cx = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "SPLIT_K": cfg.split_k, "EVEN_N": True, "USE_ASM": asm}
    sig = dict(SIG, **{k: "constexpr" for k in cx})
    # what a GPU launch specialises: pointers and ints divisible by 16 (M is do_not_specialize; stride_sam = k/128
    # and stride_wk are not always multiples of 16: left unspecialised)
    skip = ("M", "stride_sam", "stride_wk")
    ints = [i for i, (k, v) in enumerate(sig.items()) if v != "constexpr" and k not in skip]
    div = {(i,): [["tt.divisibility", 16]] for i in ints}
    try:
        src = ASTSource(k8._w4a8_grouped_kernel, sig, constexprs=cx, attrs=div)
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        asm_out = triton.compile(src, target=TARGET, options=opts).asm
    except Exception as e:  # noqa: BLE001 (report every variant)
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}", flush=True)
        return False
    regs, spill = cubin_usage(asm_out["cubin"])
    ptx = asm_out["ptx"]
    wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    mma = len(re.findall(r"\bmma\.sync", ptx))
    ftz = ptx.count(".ftz")  # a flushing fp32 multiply would zero the subnormal products of scale bytes < 7
    print(f"OK {name} regs={regs} spill={spill} lop3={ptx.count('lop3.b32')} wgmma={wgmma} mma={mma} ftz={ftz}",
          flush=True)  # fmt: skip
    return (spill_ok or spill <= 0) and ftz == 0


def main() -> int:
    """Default (the CPU test, kept short): the two defaults, W4A8_DECODE with both dequantisers. --all: every
    swept config."""
    ok = compile_one(cfgs.W4A8_DECODE, asm=False)
    for regime in ("decode", "prefill"):
        for cfg in cfgs.W4A8_SWEEP[regime]:
            if "--all" in sys.argv or cfg in (cfgs.W4A8_DECODE, cfgs.W4A8_PREFILL):
                ok &= compile_one(cfg, asm=True, spill_ok=regime == "prefill")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
