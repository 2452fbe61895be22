"""Compile every Triton kernel variant of tile_kernels for sm_90 without a GPU (ASTSource -> PTX -> cubin).

Run by test_sm90_compile.py in a subprocess with TRITON_INTERPRET unset (under the interpreter `triton.jit`
makes interpreted functions, which the compiler does not take). Prints one "OK name fma=N" or "FAIL name: why"
line per variant; exit status 1 when any failed. The interpreter runs kernels without compiling them, so this is
what catches compile-only errors (e.g. a NaN constexpr global, which Triton's global-consistency check rejects
because NaN != NaN) before the GPU run.
"""

import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deepinfer.tile_kernels.backends.cuda import triton_act as a
from deepinfer.tile_kernels.backends.cuda import triton_fp4 as f4
from deepinfer.tile_kernels.backends.cuda import triton_fused as f
from deepinfer.tile_kernels.backends.cuda import triton_hadamard as hd
from deepinfer.tile_kernels.backends.cuda import triton_mhc as mh
from deepinfer.tile_kernels.backends.cuda import triton_mhc_fused as mf
from deepinfer.tile_kernels.backends.cuda import triton_moe as mo
from deepinfer.tile_kernels.backends.cuda import triton_pool as p
from deepinfer.tile_kernels.backends.cuda import triton_quant as q
from deepinfer.tile_kernels.backends.cuda import triton_rope as ro
from deepinfer.tile_kernels.backends.cuda import triton_route as r

T = GPUTarget("cuda", 90, 32)
FAILED: list[str] = []


def go(
    name: str,
    fn,  # noqa: ANN001
    sig: dict,
    cx: dict,
    warps: int = 4,
    fusion: bool = True,
    stages: int = 3,
    maxnreg: int = 0,
) -> str | None:
    """Compile fn with the signature and constexprs (num_stages: stages; maxnreg: a register cap, 0: none); print OK
    (with the PTX's fma count) or FAIL; returns the PTX (None on failure)."""
    sig = dict(sig)
    sig.update({k: "constexpr" for k in cx})
    t0 = time.time()
    try:
        opts = {"num_warps": warps, "enable_fp_fusion": fusion, "num_stages": stages}
        if maxnreg:
            opts["maxnreg"] = maxnreg
        ptx = triton.compile(ASTSource(fn, sig, constexprs=cx), target=T, options=opts).asm["ptx"]
    except Exception as e:  # noqa: BLE001 (report every variant)
        FAILED.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:1500]}", flush=True)
        return None
    print(f"OK {name} {time.time() - t0:.1f}s fma={ptx.count('fma.rn')}", flush=True)
    return ptx


qs = {
    "x_ptr": "*bf16",
    "q_ptr": "*u8",
    "s_ptr": "*i32",
    "n_groups": "i64",
    "groups_per_row": "i32",
    "stride_xr": "i64",
    "stride_xc": "i64",
    "inv_max": "fp32",
}
for mode, sp, qp in ((0, "*i32", "*u8"), (1, "*fp32", "*u8"), (2, "*fp32", "*u8"), (3, "*bf16", "*bf16")):
    s = dict(qs)
    s["s_ptr"] = sp
    s["q_ptr"] = qp
    for hw in (False, True):
        cx = {"MODE": mode, "GROUP": 64, "BLOCK_G": 64, "HW_CAST": hw}
        ptx = go(f"quant mode {mode} hw={hw}", q._fp8_group_kernel, s, cx, 8, False)
        if ptx is not None and hw != ("cvt.rn.satfinite.e4m3x2.f32" in ptx):  # HW_CAST: the sm_90 fp8 cvt, RNE
            FAILED.append(f"quant mode {mode} hw={hw} cvt")
            print(f"FAIL quant mode {mode} hw={hw}: e4m3 cvt {'missing' if hw else 'present'}", flush=True)
ps = {
    "kv_ptr": "*fp32",
    "sc_ptr": "*fp32",
    "out_ptr": "*fp32",
    "S": "i32",
    "C": "i32",
    "skw": "i64",
    "sks": "i64",
    "skc": "i64",
    "ssw": "i64",
    "sss": "i64",
    "ssc": "i64",
}
go("pool CSA", p._pool_kernel, ps, {"BLOCK_S": 8, "BLOCK_C": 512}, 8)
go("pool HCA", p._pool_kernel, ps, {"BLOCK_S": 128, "BLOCK_C": 32}, 8)
rs = {
    "logits_ptr": "*fp32",
    "bias_ptr": "*fp32",
    "w_ptr": "*fp32",
    "ids_ptr": "*i64",
    "E": "i32",
    "stride_t": "i64",
    "stride_e": "i64",
    "stride_b": "i64",
    "route_scale": "fp32",
}
for sc in (0, 1, 2):
    go(
        f"route scoring {sc}",
        r._route_kernel,
        rs,
        {"HAS_BIAS": True, "SCORING": sc, "RENORM": True, "K": 6, "BLOCK_E": 256, "BLOCK_K": 8},
        1,
    )
for sc, (bt, nw) in ((0, (4, 4)), (1, (8, 4)), (2, (16, 8))):
    go(
        f"route rows scoring {sc} bt{bt}",
        r._route_rows_kernel,
        {**rs, "T": "i32"},
        {"HAS_BIAS": True, "SCORING": sc, "RENORM": True, "K": 6, "BLOCK_T": bt, "BLOCK_E": 256, "BLOCK_K": 8},
        nw,
    )
go(
    "route nobias k1",
    r._route_kernel,
    rs,
    {"HAS_BIAS": False, "SCORING": 0, "RENORM": False, "K": 1, "BLOCK_E": 256, "BLOCK_K": 2},
    1,
)
# the round-2 benchmark configs (int32 / constexpr-width indexing, tiles per program; a few, each compile costs ~1 s)
qs32 = {**qs, "n_groups": "i32", "stride_xr": "i32", "stride_xc": "i32"}
for mode, sp, qp, g, idx, gpr, tiles in (
    (1, "*fp32", "*u8", 128, True, 32, 1),
    (3, "*bf16", "*bf16", 64, True, 7, 2),
    (0, "*i32", "*u8", 64, False, 0, 2),
):
    s = {**(qs32 if idx else qs), "s_ptr": sp, "q_ptr": qp}
    cx = {"MODE": mode, "GROUP": g, "BLOCK_G": 64, "HW_CAST": True, "IDX32": idx, "GPR": gpr, "TILES": tiles}
    cx["LEAN"] = False  # (a defaulted constexpr must be given to ASTSource on Triton 3.9)
    go(f"quant tiles mode {mode} i32={idx} gpr={gpr} tiles={tiles}", q._fp8_group_tiles_kernel, s, cx, 8, False)
# session 6's lean epilogue (quant_tile_store_lean): every mode, one and two tiles; the e4m3 conversion must be the
# saturating hardware cvt (the lean path relies on its saturation and NaN byte instead of a clamp and a select)
for mode, sp, qp, g, gpr, tiles, w in (
    (0, "*i32", "*u8", 128, 32, 1, 8),
    (1, "*fp32", "*u8", 128, 32, 2, 8),
    (1, "*fp32", "*u8", 128, 32, 1, 4),
    (2, "*fp32", "*u8", 128, 32, 1, 8),
    (3, "*bf16", "*bf16", 64, 7, 2, 8),
):
    s = {**qs32, "s_ptr": sp, "q_ptr": qp}
    cx = {"MODE": mode, "GROUP": g, "BLOCK_G": 64, "HW_CAST": True, "IDX32": True, "GPR": gpr, "TILES": tiles}
    name = f"quant lean mode {mode} tiles={tiles} w{w}"
    ptx = go(name, q._fp8_group_tiles_kernel, s, {**cx, "LEAN": 2 if mode == 0 else 1}, w, False)  # 2: leanx
    if ptx is not None and "cvt.rn.satfinite.e4m3x2.f32" not in ptx:
        FAILED.append(f"{name} cvt")
        print(f"FAIL {name}: no cvt.rn.satfinite.e4m3x2.f32 in the PTX", flush=True)
ss = {
    "g_ptr": "*bf16",
    "u_ptr": "*bf16",
    "q_ptr": "*u8",
    "s_ptr": "*fp32",
    "y_ptr": "*bf16",
    "n_groups": "i64",
    "groups_per_row": "i32",
    "sgr": "i64",
    "sgc": "i64",
    "sur": "i64",
    "suc": "i64",
    "limit": "fp32",
    "inv_max": "fp32",
}
for mode in (1, 2):
    go(
        f"swiglu_fp8 mode {mode}",
        f._swiglu_fp8_kernel,
        ss,
        {
            "HAS_LIMIT": True,
            "STORE_Y": False,
            "MODE": mode,
            "GROUP": 128,
            "BLOCK_G": 32,
            "IS_BF16": True,
            "HW_CAST": True,
        },
        8,
        False,
    )
go(
    "swiglu_fp8 store_y",
    f._swiglu_fp8_kernel,
    ss,
    {"HAS_LIMIT": True, "STORE_Y": True, "MODE": 1, "GROUP": 128, "BLOCK_G": 32, "IS_BF16": True, "HW_CAST": True},
    8,
    False,
)
sts = {k: v for k, v in ss.items() if k != "y_ptr"}
sts.update({"n_groups": "i32", "sgr": "i32", "sgc": "i32", "sur": "i32", "suc": "i32"})
swcx = {"HAS_LIMIT": True, "MODE": 1, "GROUP": 128, "BLOCK_G": 32, "IS_BF16": True, "HW_CAST": True}
go(
    "swiglu_fp8 tiles i32 gpr=16 tiles=2",
    f._swiglu_fp8_tiles_kernel,
    sts,
    {**swcx, "IDX32": True, "GPR": 16, "TILES": 2, "LEAN": False, "FTZ_EXP": False},
    8,
    False,
)
for mode, tiles, ftz in ((1, 1, False), (2, 2, False), (1, 1, True)):
    ptx = go(
        f"swiglu_fp8 tiles lean mode {mode} tiles={tiles} ftz_exp={ftz}",
        f._swiglu_fp8_tiles_kernel,
        sts,
        {**swcx, "MODE": mode, "IDX32": True, "GPR": 16, "TILES": tiles, "LEAN": True, "FTZ_EXP": ftz},
        8,
        False,
    )
    if ptx is not None and ftz != ("ex2.approx.ftz.f32" in ptx):  # the config's inline PTX (and only there)
        FAILED.append(f"swiglu ftz_exp={ftz} ex2")
        print(f"FAIL swiglu ftz_exp={ftz}: ex2.approx.ftz.f32 {'missing' if ftz else 'present'}", flush=True)
s32 = dict(ss)
s32.update({"g_ptr": "*fp32", "u_ptr": "*fp32", "y_ptr": "*fp32"})
go(
    "swiglu_fp8 fp32",
    f._swiglu_fp8_kernel,
    s32,
    {"HAS_LIMIT": False, "STORE_Y": False, "MODE": 2, "GROUP": 128, "BLOCK_G": 32, "IS_BF16": False, "HW_CAST": True},
    8,
    False,
)
ks = {
    "kv_ptr": "*bf16",
    "w_ptr": "*bf16",
    "cos_ptr": "*fp32",
    "sin_ptr": "*fp32",
    "out_ptr": "*bf16",
    "rows_ptr": "*i64",
    "T": "i32",
    "d": "i32",
    "skr": "i64",
    "skc": "i64",
    "sw": "i64",
    "sct": "i64",
    "sck": "i64",
    "sst": "i64",
    "ssk": "i64",
    "sor": "i64",
    "eps": "fp32",
    "inv_max": "fp32",
}
for rows in (False, True):
    for quant in (False, True):
        go(
            f"kv rows={rows} quant={quant}",
            f._kv_fused_kernel,
            ks,
            {
                "HAS_ROWS": rows,
                "NOPE": 448,
                "QUANT": quant,
                "QB": 64 if quant else 2,
                "BLOCK_T": 8,
                "BLOCK_D": 512,
                "IS_BF16": True,
                "HW_CAST": True,
                "EARLY_CS": False,
                "LEAN": quant and not rows,  # session 6's lean quant-dequant (config `lean`) in one variant
            },
            8,
            False,
        )
kcx = {"HAS_ROWS": True, "NOPE": 448, "QUANT": True, "QB": 64, "BLOCK_T": 8, "BLOCK_D": 512, "IS_BF16": True}
go("kv early cos/sin", f._kv_fused_kernel, ks, {**kcx, "HW_CAST": True, "EARLY_CS": True, "LEAN": False}, 8, False)
go(
    "kv lean 4 rows 1 warp",
    f._kv_fused_kernel,
    ks,
    {**kcx, "BLOCK_T": 4, "HW_CAST": True, "EARLY_CS": False, "LEAN": True},
    1,
    False,
)
k32 = dict(ks)
k32.update({"kv_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32"})
go(
    "kv fp32",
    f._kv_fused_kernel,
    k32,
    {
        "HAS_ROWS": False,
        "NOPE": 448,
        "QUANT": True,
        "QB": 64,
        "BLOCK_T": 8,
        "BLOCK_D": 512,
        "IS_BF16": False,
        "HW_CAST": True,
        "EARLY_CS": False,
        "LEAN": False,
    },
    2,
    False,
)
ros = {
    "x_ptr": "*bf16",
    "cos_ptr": "*fp32",
    "sin_ptr": "*fp32",
    "y_ptr": "*bf16",
    "n_rows": "i32",
    "M": "i32",
    "d": "i32",
    "rope_start": "i32",
    "stride_xt": "i64",
    "stride_xm": "i64",
    "stride_xd": "i64",
    "stride_ct": "i64",
    "stride_ck": "i64",
    "stride_st": "i64",
    "stride_sk": "i64",
}
rcx = {"INVERSE": False, "BLOCK_M": 8, "BLOCK_C": 512, "BLOCK_R": 32, "EARLY_ROT": False}
go("rope fusion on", ro._rope_kernel, ros, rcx, 8, True)
go("rope fusion off", ro._rope_kernel, ros, rcx, 8, False)
go("rope early rotate", ro._rope_kernel, ros, {**rcx, "EARLY_ROT": True}, 8, False)
# session 6: the cs_rt kernel (same function, cos / sin strides unspecialised) and the whole-row kernel
go("rope cs_rt", ro._rope_kernel_cs_rt, ros, {**rcx, "BLOCK_M": 2, "EARLY_ROT": True}, 2, False)
ros_row = {**ros, "stride_xd": "i32"}
for bm, w, inv in ((2, 2, False), (1, 1, True), (4, 4, False)):
    go(f"rope row bm{bm} w{w}", ro._rope_row_kernel, ros_row, {"INVERSE": inv, "BLOCK_M": bm, "BLOCK_D": 512}, w, False)
as_ = {
    "g_ptr": "*bf16",
    "u_ptr": "*bf16",
    "y_ptr": "*bf16",
    "n_rows": "i32",
    "n": "i32",
    "stride_gr": "i64",
    "stride_gn": "i64",
    "stride_ur": "i64",
    "stride_un": "i64",
    "limit": "fp32",
}
go("swiglu", a._swiglu_kernel, as_, {"HAS_LIMIT": True, "BLOCK_R": 2, "BLOCK_N": 1024}, 4)


def mhc_types(head: bool) -> dict[str, str]:
    """Argument types of every mHC kernel (bf16 x and x_in, fp32 fn / scratch / gates; the head's post and comb
    pointers are x_in, bf16)."""
    gate = "*bf16" if head else "*fp32"
    ptrs = {"x_ptr": "*bf16", "fn_ptr": "*fp32", "part_ptr": "*fp32", "sq_ptr": "*fp32", "cnt_ptr": "*i32"}
    ptrs.update({"scale_ptr": "*fp32", "base_ptr": "*fp32", "xin_ptr": "*bf16", "post_ptr": gate, "comb_ptr": gate})
    i64 = {k: "i64" for k in ("stride_xt", "stride_xh", "stride_xd", "stride_fn_r", "stride_fn_c")}
    i32 = ("T", "S", "F", "n_blocks", "lag", "k_per_split", "d_per_split", "d_per_fin", "spin_limit", "sinkhorn_iters")
    return {**ptrs, **i64, **{k: "i32" for k in i32}, "rms_eps": "fp32", "hc_eps": "fp32"}


def go_mhc(name: str, fn, head: bool, cx: dict, *args) -> None:  # noqa: ANN001
    """go() with fn's non-constexpr arguments, in its order, typed by mhc_types(head)."""
    go(name, fn, {k: mhc_types(head)[k] for k in fn.arg_names if k not in cx}, cx, *args)


def mhc_cx(head: bool, bt: int, bk: int, bd: int, bs: int) -> dict:
    """Constexprs of the one-launch mHC kernels at V4 shapes (bf16x3 mix dots)."""
    cx = {"HC": 4, "D": 4096, "BLOCK_T": bt, "BLOCK_K": bk, "BLOCK_D": bd, "BLOCK_S": bs}
    return {**cx, "PRECISION": "bf16x3", "HEAD": head}


for head in (False, True):
    for prec in ("bf16x3", "tf32x3"):
        cx = {"HC": 4, "D": 4096, "BLOCK_T": 64, "BLOCK_K": 64, "PRECISION": prec, "HEAD": head}
        go_mhc(f"mhc mix head={head} {prec}", mh._mhc_mix_kernel, head, cx, mh.MIX_NUM_WARPS)
    cx = {"HC": 4, "D": 4096, "BLOCK_T": mh.FIN_BLOCK_T, "BLOCK_D": 256, "BLOCK_S": mh.FIN_BLOCK_S, "HEAD": head}
    go_mhc(f"mhc finish head={head}", mh._mhc_finish_kernel, head, cx, mh.FIN_NUM_WARPS)

f4s = {
    "x_ptr": "*bf16",
    "q_ptr": "*u8",
    "s_ptr": "*i32",
    "n_groups": "i64",
    "groups_per_row": "i32",
    "stride_xr": "i64",
    "stride_xc": "i64",
}
go("fp4 codes", f4._fp4_group_kernel, f4s, {"DEQUANT": False, "GROUP": 32, "BLOCK_G": 128}, 8, False)
go(
    "fp4 dequant",
    f4._fp4_group_kernel,
    {**f4s, "q_ptr": "*bf16"},
    {"DEQUANT": True, "GROUP": 32, "BLOCK_G": 128},
    8,
    False,
)
go(
    "fp4 dequant fp32",
    f4._fp4_group_kernel,
    {**f4s, "x_ptr": "*fp32", "q_ptr": "*fp32"},
    {"DEQUANT": True, "GROUP": 32, "BLOCK_G": 128},
    8,
    False,
)
f4f = {"x_ptr": "*bf16", "q_ptr": "*bf16", "s_ptr": "*i32", "n_groups": "i64"}
for deq, even in ((True, True), (True, False), (False, True), (False, False)):
    go(
        f"fp4 flat dequant={deq} even={even}",
        f4._fp4_flat_kernel,
        {**f4f, "q_ptr": "*bf16" if deq else "*u8"},
        {"DEQUANT": deq, "GROUP": 32, "BLOCK_G": 128, "EVEN": even},
        8,
        False,
    )
hs = {
    "x_ptr": "*bf16",
    "y_ptr": "*bf16",
    "h_ptr": "*bf16",
    "rows": "i32",
    "stride_xr": "i64",
    "stride_xc": "i64",
    "scale": "fp32",
}
for n, br in ((128, 32), (1024, 4), (2, 2048)):
    cx = {"N": n, "LOG_N": n.bit_length() - 1, "BLOCK_R": br, "USE_DOT": False, "IS_BF16": True, "HW_CAST": True}
    go(f"hadamard butterfly n={n}", hd._hadamard_kernel, hs, cx, max(1, min(8, br * n // 512)), False)
hcx = {"N": 128, "LOG_N": 7, "BLOCK_R": 32, "USE_DOT": False, "IS_BF16": False, "HW_CAST": True}
go(
    "hadamard butterfly fp32",
    hd._hadamard_kernel,
    {**hs, "x_ptr": "*fp32", "y_ptr": "*fp32", "h_ptr": "*fp32"},
    hcx,
    8,
    False,
)
hcx = {"N": 128, "LOG_N": 7, "BLOCK_R": 32, "USE_DOT": True, "IS_BF16": True, "HW_CAST": True}
go("hadamard dot", hd._hadamard_kernel, hs, hcx, 8, False)
hfs = {k: v for k, v in hs.items() if k != "h_ptr"}
hcx = {"N": 128, "LOG_N": 7, "GROUP": 32, "BLOCK_R": 32, "IS_BF16": True, "HW_CAST": True}
go("hadamard+fp4 fused", hd._hadamard_fp4_kernel, hfs, hcx, 8, False)
hrs = {
    "logits_ptr": "*fp32",
    "tok_ptr": "*i64",
    "tab_ptr": "*i64",
    "w_ptr": "*fp32",
    "ids_ptr": "*i64",
    "T": "i32",
    "E": "i32",
    "stride_t": "i64",
    "stride_e": "i64",
    "stride_tok": "i64",
    "stride_v": "i64",
    "stride_k": "i64",
    "route_scale": "fp32",
}
for sc in (0, 1, 2):
    hcx = {
        "SCORING": sc,
        "RENORM": True,
        "K": 6,
        "BLOCK_T": 64 if sc < 2 else 16,
        "BLOCK_K": 8,
        "BLOCK_E": 256 if sc == 2 else 16,
    }
    go(f"hash route scoring {sc}", r._hash_route_kernel, hrs, hcx, 4)

# one-launch mHC (triton_mhc_fused.py): pre with each config's constexprs, head with the default's (a few s each)
for head in (False, True):
    for name, (bt, _splits, warps, bd, bs) in mf.FUSED_CONFIGS.items():
        if not head or name == "default":
            cx = mhc_cx(head, bt, mh.MIX_BLOCK_K, bd, bs)
            go_mhc(f"mhc fused head={head} {name}", mf._mhc_fused_kernel, head, cx, warps)
    for name, (bt, _splits, _fin, warps, bd, bs) in mf.SPIN_CONFIGS.items():
        if not head or name == "spin":
            cx = mhc_cx(head, bt, mh.MIX_BLOCK_K, bd, bs)
            go_mhc(f"mhc spin head={head} {name}", mf._mhc_spin_kernel, head, cx, warps)

# MoE permute / un-permute (triton_moe.py)
for it in ("*i64", "*i32"):
    hs_ = {"idx_ptr": it, "hist_ptr": "*i32", "rank_ptr": "*i32", "n_slots": "i32", "nb": "i32", "E": "i32"}
    go(f"moe hist {it}", mo._hist_kernel, hs_, {"BLOCK_S": mo.BLOCK_S, "BLOCK_E": mo.HIST_BLOCK_E})
    rs_ = {
        "idx_ptr": it,
        "hist_ptr": "*i32",
        "rank_ptr": "*i32",
        "start_ptr": "*i32",
        "x_ptr": "*i16",
        "out_ptr": "*i16",
        "src_ptr": "*i32",
        "row_expert_ptr": "*i32",
        "nb": "i32",
        "H": "i32",
        "stride_xt": "i64",
        "stride_xh": "i64",
    }
    go(f"moe rows {it}", mo._rows_kernel, rs_, {"K": 6, "K_PAD": 8, "BLOCK_S": mo.BLOCK_S, "BLOCK_H": 4096})
go("moe scan", mo._scan_kernel, {"hist_ptr": "*i32", "counts_ptr": "*i32", "nb": "i32"}, {"BLOCK": 1024})
go(
    "moe offsets",
    mo._offsets_kernel,
    {"counts_ptr": "*i32", "offsets_ptr": "*i32", "start_ptr": "*i32", "E": "i32"},
    {"STEP": 128, "BLOCK": 256},
)
pad_s = {
    "counts_ptr": "*i32",
    "start_ptr": "*i32",
    "offsets_ptr": "*i32",
    "out_ptr": "*i16",
    "row_expert_ptr": "*i32",
    "H": "i32",
}
go("moe pad", mo._pad_kernel, pad_s, {"BLOCK_R": 8, "BLOCK_H": 1024})
for yt, ot in (("*bf16", "*bf16"), ("*fp32", "*fp32"), ("*bf16", "*fp32")):
    us_ = {
        "y_ptr": yt,
        "src_ptr": "*i32",
        "w_ptr": "*fp32",
        "out_ptr": ot,
        "H": "i32",
        "stride_yp": "i64",
        "stride_yh": "i64",
        "stride_st": "i64",
        "stride_sk": "i64",
        "stride_wt": "i64",
        "stride_wk": "i64",
    }
    ptx = go(f"moe unpermute {yt}->{ot}", mo._unpermute_kernel, us_, {"K": 6, "BLOCK_H": 1024}, 4, False)
    if ptx is not None and "fma.rn" in ptx:
        FAILED.append("moe unpermute has an FMA")
        print("FAIL moe unpermute: fma in PTX with fp fusion off", flush=True)

sys.exit(1 if FAILED else 0)
