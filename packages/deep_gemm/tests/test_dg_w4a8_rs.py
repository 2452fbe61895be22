"""The register-operand W4A8 kernel (`cuda_rs2s4`, `cuda_rs2s6`, 256-token tiles `cuda_rs2s4n256`, `cuda_rs2s3n256`;
row-reference scales folded: `cuda_rs2s4f`, `cuda_rs2s4n256f`, `cuda_rs2s3n256f`: csrc/cuda/dg_w4a8_rs.cuh).

CPU: names and routing, a Python model of the consumers' fragment extraction (chunk swizzle + word / halfword pick
+ nibble order) against the m64k32 8-bit A-fragment layout, an sm_90a nvcc compile check of dg_w4a8_rs.cu (no spills,
within the 384-thread register ceiling, no wgmma serialisation). `gpu`: vs float64 (test_dg_w4a8_cuda._check: calc_diff
+ the FP8-accumulation element bound) on partial tiles, empty groups, few CTAs, one k block per tile, adversarial scale
spreads (the exact per-32 path), tiny scales, a NaN scale byte, a slow row; CUDA-graph replay with new offs; the API's
impl= choice. Bit-equality with cuda_wg2s4 is REPORTED (printed "RS_BITEQ ..."; run with -s), not asserted: the
kernel swaps the MMA's operand roles, and whether the tensor core sums a k32 step in the same order then is not
documented. The bit-equality is asserted only for the NaN pattern and the rows past offs. The folded ("f") variants
are compared with cuda_wg2s4r (the same row-reference products except the kRelMid blocks); `test_gpu_rsf_modes`
builds scales that force each block mode (kRelFast, kRelMid mixed with kRelFast in one tile, kRelSlow, a bad row ->
the absolute scheme for its tile).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
from dg_testing import calc_diff, gen
from test_dg_w4a8_cuda import _CSRC, _check, _operands, _run_cuda

from deepinfer.deep_gemm import reference_w4a8 as ref
from deepinfer.deep_gemm.api_w4a8 import m_grouped_fp8_fp4_gemm_nt_offsets as gemm
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw

RS = cw.RS_VARIANTS
BASE = (2, 4, 0)  # cuda_wg2s4: the same 128 x 128 tiles, conversion and promotion products
BASE_REL = (2, 4, 1)  # cuda_wg2s4r: the folded variants' row-reference numerics
FOLD = tuple(v for v in RS if v[2] in (6, 7, 8))
CHEAP, CHEAP_TWIN = (2, 4, 8), (2, 4, 7)  # cuda_rs2s4n256fc: the same arithmetic as cuda_rs2s4n256f
# the fast-epilogue variants and their twins (same kernel, rs_store's per-element stores): bit-equal by construction
EPI_TWINS = {(2, 4, 9): (2, 4, 5), (2, 4, 10): (2, 4, 4)}


def _base(variant: tuple[int, int, int]) -> tuple[int, int, int]:
    return BASE_REL if variant in FOLD else BASE


def test_rs_names() -> None:
    assert [cw.variant_name(v) for v in RS] == [
        "cuda_rs2s4", "cuda_rs2s6", "cuda_rs2s4n256", "cuda_rs2s3n256", "cuda_rs2s4f", "cuda_rs2s4n256f",
        "cuda_rs2s3n256f", "cuda_rs2s4n256fc", "cuda_rs2s4n256e", "cuda_rs2s4e",
    ]  # fmt: skip
    assert cw.parse_variant("cuda_rs2s4n256e") == (2, 4, 9) and cw.parse_variant("cuda_rs2s4e") == (2, 4, 10)
    assert cw.parse_variant("cuda_rs2s4") == (2, 4, 4)
    assert cw.parse_variant("cuda_rs2s4n256f") == (2, 4, 7)
    assert cw.parse_variant("cuda_rs2s4f") == (2, 4, 6)
    assert cw.parse_variant("cuda_rs2s4n256fc") == CHEAP
    assert set(FOLD) == {(2, 4, 6), (2, 4, 7), (2, 3, 7), CHEAP} and all(v[2] in cw.SREF_SCHEMES for v in FOLD)
    assert cw.parse_variant("cuda_rs2s4n256") == (2, 4, 5)
    assert cw.parse_variant("cuda_rs2s6") == (2, 6, 4)
    assert cw.DEFAULT_VARIANT == BASE  # the default is unchanged
    assert not set(RS) & set(cw.WS_VARIANTS)


@pytest.mark.parametrize("impl", ["cuda_rs2s4", "cuda_rs2s4n256", "cuda_rs2s4n256f"])
def test_rs_api_on_cpu_runs_reference(impl: str) -> None:
    """On CPU tensors an rs impl name is accepted and runs the reference (the kernel needs CUDA tensors and `_C`)."""
    a, sfa, packed, scales, offs = _operands([5, 0, 9], 32, 256, gen(3))
    got = gemm((a, sfa), (packed, scales), offs, impl=impl)
    want = torch.empty_like(got)
    ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, want)
    assert torch.equal(got[:14], want[:14])


def _wchunk(r: int, c: int) -> int:
    """rs_wchunk: byte offset of 16-byte chunk c of packed weight row r in a stage."""
    return r * 64 + ((c ^ ((r >> 1) & 3)) << 4)


def _byte_perm(x: int, y: int, s: int) -> int:
    src = (x | (y << 32)).to_bytes(8, "little")
    return int.from_bytes(bytes(src[(s >> (4 * i)) & 7] for i in range(4)), "little")


def test_rs_fragment_model() -> None:
    """Every consumer thread's extracted codes are exactly its A-fragment elements (row 16 w + lane / 4 (+ 8), k
    32 j + 4 (lane % 4) + i (+ 16)), every chunk address is distinct and the 8 rows a warp reads per slice hit
    distinct 16-byte bank groups (conflict-free LDS.128)."""
    stage = bytearray(128 * 64)
    code_at = {}  # (row, k) -> nibble, random
    g = gen(31)
    nib = torch.randint(0, 16, (128, 128), generator=g).tolist()
    for r in range(128):
        for c in range(4):
            for b in range(16):
                k = 32 * c + 2 * b
                stage[_wchunk(r, c) + b] = nib[r][k] | (nib[r][k + 1] << 4)
                code_at[(r, k)], code_at[(r, k + 1)] = nib[r][k], nib[r][k + 1]
    assert len({_wchunk(r, c) for r in range(128) for c in range(4)}) == 512
    for tid in range(256):
        lane, q = tid & 31, tid & 3
        rl = 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2)
        hiw, sel = (q >> 1) != 0, (0x7632 if q & 1 else 0x5410)
        for j in range(4):
            words = []
            for r in (rl, rl + 8):
                x, y, z, w = (int.from_bytes(stage[_wchunk(r, j) + 4 * i : _wchunk(r, j) + 4 * i + 4], "little")
                              for i in range(4))  # fmt: skip
                words.append(_byte_perm(y if hiw else x, w if hiw else z, sel))
            # codes_to_e4m3: nibble i of the word -> byte i (r.x nibbles 0..3, r.y 4..7); a = {e0.x, e1.x, e0.y, e1.y}
            regs = [(words[0], 0), (words[1], 0), (words[0], 16), (words[1], 16)]
            for reg, (word, shift) in enumerate(regs):
                row = rl + (8 if reg & 1 else 0)
                for i in range(4):
                    got = (word >> (4 * ((shift // 4) + i))) & 15
                    want = code_at[(row, 32 * j + 4 * q + i + (16 if reg >= 2 else 0))]
                    assert got == want, (tid, j, reg, i)
    for j in range(4):  # one warp instruction: rows r0 .. r0 + 7, 16 bytes each (lanes of a row broadcast)
        for r0 in range(0, 128, 8):
            groups = {(_wchunk(r, j) % 128) // 16 for r in range(r0, r0 + 8)}
            assert len(groups) == 8, (j, r0)


def _prmt(a: int, b: int, sel: int) -> int:
    """prmt.b32 (default mode): byte i = byte (sel >> 4 i) & 7 of {b:a}, sign-replicated when bit 3 of the nibble is
    set; only the low 16 bits of sel are read."""
    src = (a | (b << 32)).to_bytes(8, "little")
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 15
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lut_words() -> list[tuple[int, int]]:
    """The kernel's LUT: (lo, hi) words of d = 0..14, byte c = e4m3 of |e2m1 code c| * 2^(6 - d) (satfinite)."""
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    words = []
    for d in range(15):
        vals = torch.tensor([m * 2.0 ** (6 - d) for m in mags]).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
        words.append((int.from_bytes(bytes(vals[:4]), "little"), int.from_bytes(bytes(vals[4:]), "little")))
    return words


def _codes_to_e4m3(w: int, lo: int, hi: int) -> tuple[int, int]:  # today's codes_to_e4m3 (__byte_perm)
    x = _prmt(lo, hi, w & 0x7777) | _prmt(0x8000, 0, (w >> 3) & 0x1111)
    y = _prmt(lo, hi, (w >> 16) & 0x7777) | _prmt(0x8000, 0, (w >> 19) & 0x1111)
    return x, y


def _codes_to_e4m3_c(w: int, lo: int, hi: int) -> tuple[int, int]:  # codes_to_e4m3_c (shared masks, asm prmt)
    m, t = w & 0x77777777, (w >> 3) & 0x11111111
    return _prmt(lo, hi, m) | _prmt(0x8000, 0, t), _prmt(lo, hi, m >> 16) | _prmt(0x8000, 0, t >> 16)


def test_rs_cheap_conversion_model() -> None:
    """kCheap (cuda_rs2s4n256fc) converts to the same bytes as today's path: every code in every nibble for every d
    (0..14, the LUT's range) and random words; the packed d word (m * 0x01010101 - sc, byte j by prmt 0x4440 | j)
    equals m - s_j for random scale words with m >= every byte (the fast paths' m: the block max or s_ref); the
    fragment words (offset 4 hiw and 8 + 4 hiw) are the chunk's x / z or y / w."""
    luts = _lut_words()
    g = gen(77)
    rand = torch.randint(0, 2**32, (300,), generator=g, dtype=torch.int64).tolist()
    words = [c * 0x11111111 for c in range(16)] + rand
    for d, (lo, hi) in enumerate(luts):
        for w in words:
            assert _codes_to_e4m3_c(w, lo, hi) == _codes_to_e4m3(w, lo, hi), (d, hex(w))
    for _ in range(2000):
        sb = torch.randint(0, 256, (4,), generator=g).tolist()
        m = int(torch.randint(max(sb), 256, (1,), generator=g))
        sc = sb[0] | sb[1] << 8 | sb[2] << 16 | sb[3] << 24
        dd = (m * 0x01010101 - sc) & 0xFFFFFFFF
        for j in range(4):
            assert _prmt(dd, 0, 0x4440 | j) == m - sb[j], (m, sb, j)
    chunk = torch.randint(0, 256, (16,), generator=g).tolist()
    word = [int.from_bytes(bytes(chunk[4 * i : 4 * i + 4]), "little") for i in range(4)]
    for hiw in (False, True):
        for sel in (0x5410, 0x7632):
            old = _byte_perm(word[1] if hiw else word[0], word[3] if hiw else word[2], sel)
            assert _prmt(word[1 if hiw else 0], word[3 if hiw else 2], sel) == old


def test_rs_epilogue_staging_model() -> None:
    """kEpi (rs_store_smem): a Python model of one consumer warpgroup's staging. Every thread's acc[4 j + e] (weight
    row 16 warp + lane / 4 + 8 (e >> 1), token 8 j + 2 (lane % 4) + (e & 1)) packed in pairs into the stmatrix.x4.trans
    registers, each lane's row address as the kernel computes it, the PTX transpose (element (row R, col C) of matrix
    i -> the address lane 8 i + C gives + 2 R); then the read-out (thread tid: token it * 16 + tid / 8, chunk tid % 8,
    swizzled) must see weight rows 8 c .. 8 c + 7 of that token in order. Also: each 8-address phase of a stmatrix and
    of the read-out touches 8 distinct 16-byte bank groups (conflict-free), and every byte is written once."""
    buf: dict[int, tuple[int, int]] = {}
    for warp in range(4):
        for j in range(0, 16, 2):
            regs, addrs = {}, {}
            for lane in range(32):
                q, mi, r = lane & 3, lane >> 3, lane & 7
                acc = {4 * jj + e: (16 * warp + (lane >> 2) + 8 * (e >> 1), 8 * jj + 2 * q + (e & 1))
                       for jj in (j, j + 1) for e in range(4)}  # fmt: skip
                regs[lane] = [(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]) for i in range(4)]  # pack(lo, hi)
                addrs[lane] = (8 * (mi >> 1) + r) * 128 + (((2 * warp + (mi & 1)) ^ r) << 4) + j * 8 * 128
            for i in range(4):
                assert len({(addrs[8 * i + c] // 16) % 8 for c in range(8)}) == 8  # conflict-free phase
                for lane in range(32):
                    row, col = lane >> 2, 2 * (lane & 3)
                    for h in range(2):
                        a = addrs[8 * i + col + h] + 2 * row
                        assert a not in buf, a
                        buf[a] = regs[lane][i][h]
    assert len(buf) == 128 * 64
    for tid in range(128):
        for it in range(8):
            t, c = it * 16 + (tid >> 3), tid & 7
            off = t * 128 + ((c ^ (t & 7)) << 4)
            assert [buf[off + 2 * i] for i in range(8)] == [(8 * c + i, t) for i in range(8)], (tid, it)
    for it in range(8):
        for w in range(4):
            for ph in range(4):  # 8 threads = one token row: its 8 chunks
                tids = [32 * w + 8 * ph + x for x in range(8)]
                offs = [(it * 16 + (t >> 3)) * 128 + (((t & 7) ^ ((it * 16 + (t >> 3)) & 7)) << 4) for t in tids]
                assert len({(o // 16) % 8 for o in offs}) == 8


def test_rs_sm90_compile() -> None:
    """nvcc 13 builds dg_w4a8_rs.cu for sm_90a: the rs kernels + the pre-pass, <= 168 registers (65536 / 384
    threads), no wgmma serialisation / ignored-setmaxnreg warning (skipped without nvcc). No spills, except the
    folded 256-token kernels (setmaxnreg 232 per consumer): ptxas keeps one tile-schedule word in local memory there
    (8 bytes: one STL per CTA, one LDL per tile epilogue; the k-block loop has none)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(_CSRC / "dg_w4a8_rs.cu"), "-o", os.devnull]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)]
    # (kernel name, spill store bytes) per entry function (ptxas prints a function's lines after its name)
    chunks = res.stderr.split("Compiling entry function '")[1:]
    spills = [(c.split("'")[0], re.search(r"(\d+) bytes spill stores", c).group(1)) for c in chunks]
    assert len(regs) == len(RS) + 1 and len(spills) == len(RS) + 1, res.stderr[-2000:]
    assert max(regs) <= 168, res.stderr[-3000:]
    for name, stores in spills:
        fold256 = "Li256ELb1E" in name  # w4a8_rs_kernel<S, 256, true>
        assert int(stores) <= (8 if fold256 else 0), (name, stores, res.stderr[-3000:])
    assert "C7510" not in res.stderr and "C7508" not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not cw.available(), reason="_C built without the W4A8 CUDA kernel")


def _report_bit_equal(ops: tuple, counts: list[int], variant: tuple[int, int, int], what: str, ctas: int = 0):
    """Runs `variant` and cuda_wg2s4 (folded variants: cuda_wg2s4r); prints whether they are bit-equal (NaN-safe);
    returns the variant's output."""
    base = _run_cuda(ops, _base(variant), counts, ctas)
    got = _run_cuda(ops, variant, counts, ctas)
    rows = sum(counts)
    ne = int((got[:rows].view(torch.int16) != base[:rows].view(torch.int16)).sum())
    d = calc_diff(got[:rows].double().nan_to_num(), base[:rows].double().nan_to_num())
    print(f"RS_BITEQ {cw.variant_name(variant)} {what}: equal={ne == 0} differ={ne}/{got[:rows].numel()} "
          f"calc_diff_vs_{cw.variant_name(_base(variant))[5:]}={d:.3e}")  # fmt: skip
    return got


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", RS, ids=cw.variant_name)
@pytest.mark.parametrize(
    ("counts", "n", "k", "ctas"),
    [
        ([3, 0, 130, 64, 1], 256, 512, 0),  # empty group, partial tiles (m not a multiple of 128), 2 m tiles
        ([200, 17], 192, 256, 3),  # n tail tile, few CTAs: several tiles each (the ring runs across tiles)
        ([0, 0, 40], 128, 1024, 0),  # leading empty groups
        ([5, 9, 140], 128, 128, 2),  # one k block per tile
        ([256] * 6, 512, 2048, 0),  # full tiles, many k blocks per tile
    ],
)
def test_gpu_rs_vs_float64(variant: tuple[int, int, int], counts: list[int], n: int, k: int, ctas: int) -> None:
    ops = _operands(counts, n, k, gen(sum(counts) + n + k + 1))
    what = f"counts={counts} n={n} k={k} ctas={ctas}"
    out = _report_bit_equal(ops, counts, variant, what, ctas)
    _check(out, ops, counts, f"{cw.variant_name(variant)} {what}")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", RS, ids=cw.variant_name)
@pytest.mark.parametrize(
    "sb", [(113, 127), (110, 127), (30, 200), (1, 40)], ids=["spread14", "spread17", "adv", "tiny"]
)
def test_gpu_rs_scales(variant: tuple[int, int, int], sb: tuple[int, int]) -> None:
    """Scale spreads around the fast-path bound and far past it (the per-32 path), tiny (subnormal factors)."""
    counts = [70, 5, 131]
    ops = _operands(counts, 256, 512, gen(sb[1] + 7), sb)
    out = _report_bit_equal(ops, counts, variant, f"scales {sb}")
    _check(out, ops, counts, f"{cw.variant_name(variant)} scales {sb}", elementwise=sb != (1, 40))


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", RS, ids=cw.variant_name)
def test_gpu_rs_nan_and_slow_row(variant: tuple[int, int, int]) -> None:
    """A NaN scale byte (NaN column of that group's rows, as the reference and cuda_wg2s4) and one slow row whose
    only codes sit in its small-scale group (a wrong fast path would zero that column)."""
    counts = [33, 90]
    a, sfa, packed, scales, offs = _operands(counts, 256, 256, gen(21))
    scales[0, 5, 0:4] = torch.tensor([140, 120, 120, 120], dtype=torch.uint8)
    packed[0, 5, 0:16] = 0
    scales[1, 7, 3] = 255
    ops = (a, sfa, packed, scales, offs)
    out = _report_bit_equal(ops, counts, variant, "nan byte + slow row")
    base = _run_cuda(ops, _base(variant), counts)
    assert torch.equal(out.isnan(), base.isnan()), f"{cw.variant_name(variant)}: NaN pattern differs from the base"
    assert out[33:123, 7].isnan().all() and not out[:33, 7].isnan().any()
    keep = [c for c in range(256) if c != 7]
    sub = (a, sfa, packed[:, keep].contiguous(), scales[:, keep].contiguous(), offs)
    _check(out[:, keep].contiguous(), sub, counts, f"{cw.variant_name(variant)} nan byte + slow row (other columns)")


def _mode_scales(kind: str, counts: list[int], n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """E8M0 bytes [G, n, k/32] forcing the folded variants' block modes (4 bytes per 128-deep block)."""
    shape = (len(counts), n, k // 32)
    noise = torch.randint(0, 4, shape, generator=g, dtype=torch.int32)
    if kind == "fast":  # every row spans <= 7 binades over k: kRelFast everywhere
        sc = 120 + 2 * noise
    elif kind == "mid_mix":  # even blocks ~20 binades below the row reference (kRelMid), odd blocks kRelFast
        blk = (torch.arange(k // 32) // 4) % 2
        sc = torch.where(blk == 0, 100, 120) + noise
    elif kind == "slow_block":  # block 1 of every row spreads 16 binades (kRelSlow), the others kRelFast
        sc = 120 + noise
        sc[:, :, 4] = 104
    else:  # "bad_row": row 3 of each expert spans 110 binades: its n tile runs the absolute scheme, the others rel
        sc = 120 + noise
        sc[:, 3, 0] = 10
    return sc.to(torch.uint8)


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", FOLD, ids=cw.variant_name)
@pytest.mark.parametrize("kind", ["fast", "mid_mix", "slow_block", "bad_row"])
def test_gpu_rsf_modes(variant: tuple[int, int, int], kind: str) -> None:
    """Every block mode of the folded variants (and modes mixed within one tile) vs float64 (FP8 element bound);
    bit-equality with cuda_wg2s4r reported (expected except kRelMid blocks, which wg2s4r runs per 32)."""
    counts = [70, 5, 131]
    a, sfa, packed, _, offs = _operands(counts, 256, 512, gen(40))
    scales = _mode_scales(kind, counts, 256, 512, gen(41))
    ops = (a, sfa, packed, scales, offs)
    out = _report_bit_equal(ops, counts, variant, f"mode {kind}")
    _check(out, ops, counts, f"{cw.variant_name(variant)} mode {kind}")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("kind", ["fast", "mid_mix", "slow_block", "bad_row", "nan"])
def test_gpu_rs_cheap_bit_equal(kind: str) -> None:
    """cuda_rs2s4n256fc converts to the same e4m3 bytes as cuda_rs2s4n256f (test_rs_cheap_conversion_model) and
    runs the same wgmma / promotion sequence: its output must be BIT-equal (NaN-safe) in every block mode."""
    counts = [300, 0, 77, 129]
    a, sfa, packed, scales, offs = _operands(counts, 256, 1024, gen(50))
    scales = _mode_scales("bad_row" if kind == "nan" else kind, counts, 256, 1024, gen(51))
    if kind == "nan":
        scales[2, 9, 5] = 255
    ops = (a, sfa, packed, scales, offs)
    got, twin = _run_cuda(ops, CHEAP, counts), _run_cuda(ops, CHEAP_TWIN, counts)
    ne = int((got.view(torch.int16) != twin.view(torch.int16)).sum())
    assert ne == 0, f"cuda_rs2s4n256fc vs cuda_rs2s4n256f ({kind}): {ne}/{got.numel()} bf16 values differ"


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", list(EPI_TWINS), ids=cw.variant_name)
@pytest.mark.parametrize(
    ("counts", "n", "k", "ctas", "sb"),
    [
        ([3, 0, 130, 64, 1, 300], 256, 512, 0, None),  # empty group, ragged groups, > 256 rows in one group
        ([200, 17, 0], 192, 256, 3, None),  # n tail tile (chunks past n), few CTAs, trailing empty group
        ([5, 9, 140, 513], 384, 1024, 0, (30, 200)),  # adversarial scales (the per-32 path)
        ([70, 5, 131], 256, 512, 1, (1, 40)),  # tiny scales (subnormal factors), one CTA walks every tile
        ([256] * 4, 512, 2048, 0, None),  # full tiles
    ],
)
def test_gpu_rs_epi_bit_equal(variant, counts: list[int], n: int, k: int, ctas: int, sb) -> None:
    """The fast epilogue stores the same bf16 bits as its twin (cvt.rn.bf16x2 = two cvt.rn.bf16): BIT-equal over the
    whole out (rows past offs stay NaN in both; a NaN scale byte gives the same NaN pattern), vs float64 too."""
    g = gen(sum(counts) + n + 3 * k)
    ops = _operands(counts, n, k, g) if sb is None else _operands(counts, n, k, g, sb)
    if sb is None:
        ops[3][len(counts) - 1 if counts[-1] else 0, 7, 1] = 255  # a NaN column in one group
    got, twin = _run_cuda(ops, variant, counts, ctas), _run_cuda(ops, EPI_TWINS[variant], counts, ctas)
    nan_same = torch.equal(got.isnan(), twin.isnan())  # (NaN positions: both cvt.rn forms give the canonical NaN)
    ne = int(((got.view(torch.int16) != twin.view(torch.int16)) & ~(got.isnan() & twin.isnan())).sum())
    assert ne == 0 and nan_same, (
        f"{cw.variant_name(variant)} vs {cw.variant_name(EPI_TWINS[variant])} counts={counts} n={n} k={k} "
        f"ctas={ctas} sb={sb}: {ne}/{got.numel()} bf16 values differ, NaN pattern equal={nan_same}"
    )
    assert got[sum(counts) :].isnan().all(), "rows past offs[-1] were written"
    if sb is None:
        keep = [c for c in range(n) if c != 7]
        a, sfa, packed, scales, offs = ops
        sub = (a, sfa, packed[:, keep].contiguous(), scales[:, keep].contiguous(), offs)
        _check(got[:, keep].contiguous(), sub, counts, f"{cw.variant_name(variant)} counts={counts}")


@pytest.mark.gpu
@needs_kernel
def test_gpu_rs_epi_misaligned_out() -> None:
    """The fast epilogue's 16-byte stores need a 16-byte aligned out: a clear ValueError, not a fault."""
    counts = [8]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 128, 128, gen(5), extra_rows=0))
    flat = torch.empty(8 * 128 + 1, dtype=torch.bfloat16, device="cuda")
    out = flat[1:].view(8, 128)
    with pytest.raises(ValueError, match="16-byte aligned"):
        cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, (2, 4, 9))


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", RS, ids=cw.variant_name)
def test_gpu_rs_cuda_graph_replay(variant: tuple[int, int, int]) -> None:
    """Captured once, replayed with new offs (groups 0 and 2 empty): offs is read on the device only."""
    counts = [4, 4, 4, 4]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 128, 256, gen(22), extra_rows=0))
    out = torch.full((16, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, variant)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, variant)
    offs.copy_(torch.tensor([0, 1, 1, 9], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.empty_like(out)
    ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, want)
    d = calc_diff(out[:9], want[:9])
    assert d < 1e-5, f"{cw.variant_name(variant)} graph replay: calc_diff {d:.3e}"
    assert out[9:].isnan().all()


@pytest.mark.gpu
@needs_kernel
def test_gpu_rs_api_impl() -> None:
    """impl='cuda_rs2s4' through the API: bit-equal to the direct call."""
    counts = [50, 0, 77]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 256, 512, gen(23)))
    direct = torch.empty(a.shape[0], 256, dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, direct, RS[0])
    got = gemm((a, sfa), (packed, scales), offs, impl="cuda_rs2s4")
    assert torch.equal(got[:127], direct[:127])
