"""The layout of the KV kernel's RMSNorm sum per token row, compiled for sm_90 (no GPU needed).

Run by test_kv_rows_exact.py in a subprocess with TRITON_INTERPRET unset (the interpreter has no layouts). For each
tiling (BLOCK_T tokens, num_warps) it compiles `_kv_fused_kernel` as V4 launches it (d = 512 bf16, rope 64, FP8
blocks of 64; pointers, d and the row strides divisible by 16 and unit strides constexpr, as Triton specialises them
at launch), finds the first `tt.reduce` of the TTGIR (the sum of squares) and prints one JSON line: the operand's
blocked layout. A row's sum order is fixed by how the layout spreads the row over registers, lanes and warps
(Triton reduces each row from its own registers in register order, then its lanes by xor shuffles, then its warps),
so two tilings whose layouts spread a row alike (the same sizePerThread, threadsPerWarp and warpsPerCTA along the
columns, one lane and one warp along the rows) add every row's squares in the same order: the same bits.
"""

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deepinfer.tile_kernels.backends.cuda import triton_fused as f

SIG = {
    "kv_ptr": "*bf16",
    "w_ptr": "*bf16",
    "cos_ptr": "*fp32",
    "sin_ptr": "*fp32",
    "out_ptr": "*bf16",
    "rows_ptr": "*i64",
    "T": "i32",
    "d": "i32",
    "skr": "i32",
    "sct": "i32",
    "sst": "i32",
    "sor": "i32",
    "eps": "fp32",
    "inv_max": "fp32",
}
DIV16 = ("kv_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "rows_ptr", "d", "skr", "sct", "sst", "sor")
# (BLOCK_T, warps, quantised): the default, the rule's two tilings, bt2_w2 (a row over two warps: the check's negative
# control); V4's quantised entry only (compile time; the GPU tests check the unquantised bits too)
TILINGS = ((1, 1, True), (2, 1, True), (4, 1, True), (2, 2, True))


def reduce_layout(ttgir: str) -> dict:
    """The first tt.reduce's operand layout in a TTGIR text: {"shape", "sizePerThread", "threadsPerWarp",
    "warpsPerCTA", "order"}."""
    m = re.search(r'"tt\.reduce".*?\}\) : \(tensor<([0-9x]+)xf32, (#\w+)>\)', ttgir, re.S)
    if m is None:
        raise ValueError("no fp32 tt.reduce in the TTGIR")
    enc = re.search(rf"^{re.escape(m.group(2))} = #ttg\.blocked<\{{(.*?)\}}>", ttgir, re.M)
    if enc is None:
        raise ValueError(f"{m.group(2)} is not a blocked layout")
    out = {"shape": [int(v) for v in m.group(1).split("x")]}
    for key, val in re.findall(r"(\w+) = \[([0-9, ]*)\]", enc.group(1)):
        out[key] = [int(v) for v in val.split(",")]
    return out


def compile_tiling(bt: int, warps: int, quant: bool = True) -> dict:
    fn = f._kv_fused_kernel
    cx = {"skc": 1, "sw": 1, "sck": 1, "ssk": 1, "HAS_ROWS": False, "NOPE": 448, "QUANT": quant, "QB": 64}
    cx.update(BLOCK_T=bt, BLOCK_D=512, IS_BF16=True, HW_CAST=True, EARLY_CS=False, LEAN=False)
    sig = {**SIG, **{k: "constexpr" for k in cx}}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in DIV16}
    src = ASTSource(fn, sig, constexprs=cx, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "enable_fp_fusion": False})
    return {"bt": bt, "warps": warps, "quant": quant, **reduce_layout(k.asm["ttgir"])}


if __name__ == "__main__":
    for bt, w, quant in TILINGS:
        try:
            print(json.dumps(compile_tiling(bt, w, quant)), flush=True)
        except Exception as e:  # noqa: BLE001 (report the failing tiling)
            print(json.dumps({"bt": bt, "warps": w, "quant": quant, "error": f"{type(e).__name__}: {e}"[:500]}))
            sys.exit(1)
