"""Compiled FP8 block-scaled GEMM with double-buffered promotion ("fp8_db", sm_90a wgmma; issue 6).

Kernels: `csrc/cuda/dg_fp8_db.cuh` (cp.async) and `csrc/cuda/dg_fp8_tma.cuh` (TMA, wide) (built into `deepinfer.deep_gemm._C` by DEEPINFER_DEVICE=cuda builds; no CUTLASS).
Same math as `reference.fp8_gemm_nt`: out[r, c] = sum over 128-deep k blocks kb of sfa[r, kb] * sfb[c // 128, kb] *
(a[r, kb-block] . b[c, kb-block]), fp32 accumulation, bf16 out. Each consumer warpgroup keeps two temporary
accumulator sets, so block b's wgmmas run while block b - 1 is promoted (the CUTLASS collective waits for every
block's wgmmas before promoting). Not wired into `api.py`: the benchmark measures it beside the API first.

`tma=True` (session 9; GPU-tested in session 10): the same kernel with a TMA producer (`fp8_db_tma_kernel`: one
thread issues two `cp.async.bulk.tensor` copies per stage instead of 128 threads' 16-byte cp.async address math;
the scales still by cp.async). Same shared-memory bytes, same math: bit-equal to `tma=False` (names `fp8_db_t5`,
`fp8_db_t4`; 49 GPU tests). H200: 1.20-1.60x the cp.async kernel, 0.80-1.08x the CUTLASS API (README). Stagger is
not built with TMA.

`wide=True` (session 12; H200: bit-equal to fp8_db_t4, 1.11-1.22x it; `fp8_gemm_nt` runs it where `wide_rule` says):
`fp8_wide_kernel`, 128 x 256
tiles with the TMA producer (tma mode 2; names `fp8_wide_t4` / `fp8_wide_t3`, ring depth 4 / 3, default
`DEFAULT_WIDE_STAGES`), n % 256 == 0. Why: fp8_db_t4 is bound by shared-memory bandwidth (per k block 48 KiB of wgmma
operand reads + 32 KiB of TMA writes per 512 tensor clocks, 160 B/clk against ~128 B/clk; Nsight Compute: shared
75 %, tensor pipe 55 %); a 256-wide tile cuts the TMA bytes per FLOP by 25 % (144 B/clk). Each consumer warpgroup
owns 64 rows x 256 columns: acc[128] + ONE temporary[64] at setmaxnreg 232 (producer 40: 128 * 40 + 256 * 232 =
384 * 168); per k block and n half: four m64n128k32 wgmmas into the temporary, wait, promote; so no wgmma stays in
flight across a promotion within one warpgroup (the two consumer warpgroups interleave instead). Stage = A box
[128, 128] + B box [256, 128] = 48 KiB; 4 stages + scales + the g = 4096 prefix = 216,292 bytes of 227 KiB, so the
epilogue stores bf16 straight from registers (a quad-shuffle transpose makes 16-byte row stores) instead of a staging
tile. Same per-element products and promotion order as `fp8_db_t4`: bit-equal (the GPU tests check it).

First version's limits: fp32 scales only, n % 128 == 0 (wide: n % 256 == 0), k % 128 == 0, out bf16 16-byte aligned,
a and b 16-byte aligned, <= MAX_GROUPS groups.
"""

from __future__ import annotations

import functools

import torch

from ..._backend import compiled_module

__all__ = ["DEFAULT_STAGES", "DEFAULT_WIDE_STAGES", "MAX_GROUPS", "VARIANTS", "W4A8_VARIANT", "WIDE", "available",
           "compiled_variants", "fp8_gemm_nt_db", "launch_variant", "m_grouped_fp8_gemm_nt_offsets_db",
           "variant_name"]  # fmt: skip

FP8 = torch.float8_e4m3fn
DEFAULT_STAGES = 5  # ring depth (4 also built; the benchmark measures both)
DEFAULT_WIDE_STAGES = 4  # ring depth of the 128 x 256 tile kernel (3 also built; 5 does not fit in shared memory)
WIDE = 2  # the tma mode of the 128 x 256 tile kernel (fp8_wide_kernel: TMA producer, n % 256 == 0)
# (stages, stagger, tma) built into _C (kept in sync with fp8_db_variants() in csrc/cuda/dg_fp8_db.cu): stagger 1
# starts consumer warpgroup 1 ~1 us late so the two warpgroups' tile-end drains do not coincide; tma 1 feeds the ring
# with TMA copies instead of cp.async (both bit-equal to (stages, 0, 0)); tma 2 (WIDE): 128 x 256 tiles with the TMA
# producer (bit-equal to (4, 0, 1)). fp8_db_variants() also lists W4A8_VARIANT, the W4A8 kernel on the wide
# consumers (tma mode 4; FP4 weight chunks as b: cuda_w4a8_wide.py), which is not an FP8 GEMM.
VARIANTS: tuple[tuple[int, int, int], ...] = (
    (4, 0, 0), (5, 0, 0), (5, 1, 0), (4, 0, 1), (5, 0, 1), (4, 0, WIDE), (3, 0, WIDE)
)  # fmt: skip
W4A8_VARIANT = (3, 0, 4)
MAX_GROUPS = 4096  # the kernel keeps a per-group tile prefix in shared memory (kMaxGroups)


def _module():
    """`deepinfer.deep_gemm._C` when it imports and has the fp8_db kernel, else None."""
    mod = compiled_module()
    return mod if mod is not None and hasattr(mod, "fp8_db_grouped") else None


def available() -> bool:
    """True when `_C` has the fp8_db kernel (a DEEPINFER_DEVICE=cuda build of this source tree)."""
    return _module() is not None


@functools.cache
def compiled_variants() -> tuple[tuple[int, int, int], ...]:
    """(stages, stagger, tma) triples `_C` was built with (empty without `_C`; a `_C` built before the TMA variant
    returns pairs: read as tma 0)."""
    mod = _module()
    if mod is None:
        return ()
    return tuple((int(v[0]), int(v[1]), int(v[2]) if len(v) > 2 else 0) for v in mod.fp8_db_variants())


def variant_name(stages: int, stagger: bool, tma: int = 0) -> str:
    """(5, False) -> 'fp8_db_s5'; (5, True) -> 'fp8_db_s5_stagger'; (5, False, 1 or True) -> 'fp8_db_t5' (TMA
    producer); (4, False, WIDE) -> 'fp8_wide_t4' (128 x 256 tiles)."""
    suffix = "_stagger" if stagger else ""
    if int(tma) == WIDE:
        return f"fp8_wide_t{stages}{suffix}"
    return f"fp8_db_{'t' if tma else 's'}{stages}{suffix}"


def _check(name: str, t: object, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    return t


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def _validate(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    wide: bool = False,
) -> tuple[int, int, int, int]:
    """Shapes, dtypes, devices, contiguity and alignment of the grouped form (wide: also n % 256 == 0); returns
    (m, n, k, g)."""
    _check("a", a, FP8, 2)
    _check("b", b, FP8, 3)
    m, k = a.shape
    g, n, kb = b.shape
    if k % 128 != 0 or k == 0:
        raise ValueError(f"a: expected k % 128 == 0 and k > 0 (this kernel's first version), got k = {k}")
    if n % 128 != 0 or n == 0:
        raise ValueError(f"b: expected n % 128 == 0 and n > 0 (this kernel's first version), got n = {n}")
    if wide and n % 256 != 0:
        raise ValueError(f"b: expected n % 256 == 0 with wide=True (128 x 256 tiles), got n = {n}")
    if kb != k:
        raise ValueError(f"b: expected k = {k} (a's), got shape {tuple(b.shape)}")
    if not 1 <= g <= MAX_GROUPS:
        raise ValueError(f"b: expected 1..{MAX_GROUPS} groups, got {g}")
    _check("sfa", sfa, torch.float32, 2)
    _check_shape("sfa", sfa, (m, k // 128))
    _check("sfb", sfb, torch.float32, 3)
    _check_shape("sfb", sfb, (g, n // 128, k // 128))
    _check("offs", offs, torch.int32, 1)
    _check_shape("offs", offs, (g,))
    _check("out", out, torch.bfloat16, 2)
    _check_shape("out", out, (m, n))
    for name, t in (("sfa", sfa), ("b", b), ("sfb", sfb), ("offs", offs), ("out", out)):
        if t.device != a.device:
            raise ValueError(f"{name}: expected device {a.device} (a's), got {t.device}")
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name}: expected a 16-byte aligned tensor, got address {t.data_ptr():#x}")
    return m, n, k, g


def _mode(stages: int | None, tma: bool, wide: bool) -> tuple[int, int]:
    """(stages, tma mode): wide selects the 128 x 256 tile kernel (its TMA producer is implied); stages None: the
    default ring depth of that kernel."""
    if stages is None:
        stages = DEFAULT_WIDE_STAGES if wide else DEFAULT_STAGES
    return stages, WIDE if wide else int(tma)


def launch_variant(
    a, sfa, b, sfb, offs, out, m: int, n: int, k: int, g: int, stages: int, stagger: bool, ctas: int, tma: int
) -> torch.Tensor:
    """`_C.fp8_db_grouped` on validated operands (the callers check shapes, dtypes, devices and alignment): the
    (stages, stagger, tma) variant must be built; m == 0 returns out untouched. Returns out."""
    mod = _module()
    if mod is None:
        raise RuntimeError("the fp8_db CUDA kernel is not built (build deep_gemm with DEEPINFER_DEVICE=cuda)")
    if not a.is_cuda:
        raise ValueError(f"a: expected a CUDA tensor, got device {a.device}")
    key = (stages, int(stagger), int(tma))
    if key not in compiled_variants():
        raise ValueError(f"(stages, stagger, tma): expected one of {compiled_variants()}, got {key}")
    if m == 0:
        return out
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream(a.device).cuda_stream
        mod.fp8_db_grouped(
            stages, int(stagger), int(tma), a.data_ptr(), sfa.data_ptr(), b.data_ptr(), sfb.data_ptr(), offs.data_ptr(),
            out.data_ptr(), m, n, k, g, ctas, stream,
        )  # fmt: skip
    return out


def m_grouped_fp8_gemm_nt_offsets_db(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    stages: int | None = None,
    stagger: bool = False,
    ctas: int = 0,
    tma: bool = False,
    wide: bool = False,
) -> torch.Tensor:
    """Grouped FP8 GEMM, contiguous layout: rows [offs[i-1], offs[i]) of out = group i's rows of a @ b[i]^T.

    a: e4m3 [m, k]; sfa: fp32 [m, k / 128] (1 x 128 blocks); b: e4m3 [g, n, k] (K-major); sfb: fp32
    [g, n / 128, k / 128] (128 x 128 blocks); offs: int32 [g] cumulative row ends (read on the device only; rows past
    offs[-1] are not written); out: bf16 [m, n]. k % 128 == 0, n % 128 == 0. (stages, stagger): ring depth (None:
    DEFAULT_STAGES, or DEFAULT_WIDE_STAGES with wide) and the staggered consumer start; tma: the TMA producer; wide:
    the 128 x 256 tile kernel (TMA producer implied; n % 256 == 0) (`compiled_variants()` lists the built triples);
    ctas: persistent CTAs (0: one per SM). Returns out.
    """
    stages, mode = _mode(stages, tma, wide)
    m, n, k, g = _validate(a, sfa, b, sfb, offs, out, wide)
    return launch_variant(a, sfa, b, sfb, offs, out, m, n, k, g, stages, stagger, ctas, mode)


_DENSE_OFFS: dict[tuple[int, torch.device], torch.Tensor] = {}  # (m, device) -> int32 [1] = m, never evicted
_DENSE_OFFS_MAX = 4096  # distinct m kept (512 bytes each); past this, a fill per call


def _dense_offs(m: int, device: torch.device) -> torch.Tensor:
    """int32 [1] = m, the dense call's one group (read-only: the kernel only reads it). Made once per (m, device)
    outside CUDA-graph capture and reused, inside a capture too (a graph captured after a warm-up call reads the
    cached tensor: no fill kernel per call, 3-10 % of a 35-70 us GEMM). Entries are never dropped, because a captured
    graph may still read one; a tensor first needed inside a capture is made there (a fill in the graph) and not kept
    (it belongs to the graph's memory pool)."""
    key = (m, device)
    t = _DENSE_OFFS.get(key)
    if t is not None:
        return t
    t = torch.full((1,), m, dtype=torch.int32, device=device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if device.type == "cuda" and not capturing and len(_DENSE_OFFS) < _DENSE_OFFS_MAX:
        _DENSE_OFFS[key] = t
    return t


def fp8_gemm_nt_db(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    stages: int | None = None,
    stagger: bool = False,
    ctas: int = 0,
    tma: bool = False,
    wide: bool = False,
) -> torch.Tensor:
    """Dense FP8 GEMM out = dequant(a, sfa) @ dequant(b, sfb)^T as one group.

    a: e4m3 [m, k]; sfa: fp32 [m, k / 128]; b: e4m3 [n, k]; sfb: fp32 [n / 128, k / 128]; out: bf16 [m, n]. Other
    arguments as `m_grouped_fp8_gemm_nt_offsets_db`.
    """
    for name, t, ndim in (("b", b, 2), ("sfb", sfb, 2)):
        if isinstance(t, torch.Tensor) and t.dim() != ndim:
            raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"a: expected a torch.Tensor, got {type(a).__name__}")
    b3 = b.unsqueeze(0) if isinstance(b, torch.Tensor) else b
    sfb3 = sfb.unsqueeze(0) if isinstance(sfb, torch.Tensor) else sfb
    offs = _dense_offs(a.shape[0], a.device)
    stages, mode = _mode(stages, tma, wide)
    m, n, k, g = _validate(a, sfa, b3, sfb3, offs, out, wide)
    return launch_variant(a, sfa, b3, sfb3, offs, out, m, n, k, g, stages, stagger, ctas, mode)


# ------------------------------------------------------------------------------------------------ API routing

WIDE_API_MIN_M = 4096  # below: not measured against the API's CUTLASS configs; they keep those calls


def wide_rule(m: int, n: int, k: int) -> bool:
    """True where `fp8_gemm_nt`'s auto dispatch runs fp8_wide_t4 instead of its CUTLASS config (H200, session 12,
    two runs of `bench_dg_fp8_db.py`: fp8_wide 1.01-1.31x the API at m >= 4096 with k <= 2048, 1.06-1.11x at m = 4096
    with k = 4096; 0.95-0.97x at k = 8192 and at m = 16384 x n = 2048 x k = 4096, which stay on CUTLASS)."""
    if m < WIDE_API_MIN_M or n % 256:
        return False
    return k <= 2048 or (k <= 4096 and m <= 4096)


def wide_applies(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None
) -> bool:
    """True when fp8_wide_t4 can run this already-validated `fp8_gemm_nt` call as it is (no copies, no host sync):
    CUDA sm_90 with the kernel in `_C`, FP8 weights, float32 scales in the API's layouts, no C, contiguous bf16 out,
    n % 256 == 0, k % 128 == 0, 16-byte aligned a / b / out."""
    from .cutlass_fp8 import _aligned, _is_sm90  # the CUTLASS path's device checks (shared, not repeated)

    if c is not None or not (a.is_cuda and b.dtype == FP8 and out.dtype == torch.bfloat16 and out.is_contiguous()):
        return False
    if sfa.dtype != torch.float32 or sfb.dtype != torch.float32 or not (sfa.is_contiguous() and sfb.is_contiguous()):
        return False
    (m, k), n = a.shape, b.shape[0]
    if k == 0 or k % 128 or n % 256 or not (_aligned(a) and _aligned(b) and _aligned(out)):
        return False
    if (DEFAULT_WIDE_STAGES, 0, WIDE) not in compiled_variants():
        return False
    return _is_sm90(a.device.index if a.device.index is not None else torch.cuda.current_device())
