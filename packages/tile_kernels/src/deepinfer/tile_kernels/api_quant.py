"""Public FP8 (e4m3) / FP4 (e2m1) quantisation ops: argument validation, then the reference in `ref/quant.py`,
or, for CUDA fp32/bf16/fp16 input with a power-of-two block, the bit-exact Triton kernels of
`backends/cuda/triton_quant.py` (fp8_quant_ue8m0, fp8_quant_dequant_ue8m0, per_token_group_quant_fp8) and
`backends/cuda/triton_fp4.py` (fp4_quant_ue8m0, fp4_quant_dequant_ue8m0); `hadamard_transform` (n <= 1024) runs
the bit-exact butterflies of `backends/cuda/triton_hadamard.py`.

UE8M0 scales are powers of two 2^e. The exponent is ``ceil(log2(amax * fp32(1/max)))`` taken from the
IEEE bits of that fp32 product (DeepSeek's kernels do the same), with amax floored at 1e-4 (FP8) or
6 * 2^-126 (FP4). Casts round to nearest, ties to even, and saturate at +-448 (e4m3) / +-6 (e2m1).

NaN: a block whose amax is NaN or +inf gets scale exponent 128 (E8M0 byte 255, E8M0's NaN code); the
quantise-dequantise functions return NaN for every element of such a block. Weight quantisers
(`fp8_block_quant`, `fp4_pack`) reject non-finite weights instead.

Overflow: a value within ~15 % of fp32's largest finite value can round up to 2^128 and dequantise to inf
(the scale exponent stays <= 127, the rounded mantissa carries over); bf16/fp16 outputs overflow likewise
near their own maxima.
"""

from __future__ import annotations

import torch

from ._dispatch import triton_float_ok
from .ref import quant as _ref

__all__ = [
    "fp8_quant_ue8m0",
    "fp8_quant_dequant_ue8m0",
    "fp4_quant_ue8m0",
    "fp4_quant_dequant_ue8m0",
    "hadamard_transform",
    "per_token_group_quant_fp8",
    "fp8_block_quant",
    "dequant_fp8_block",
    "fp4_pack",
    "unpack_fp4",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SCALE_FMTS = ("ue8m0", "fp32")
_HADAMARD_MAX_N = 1024  # triton_hadamard.MAX_N (kept here so the CPU path never imports triton)

# per_token_group_quant_fp8's Triton tile (elements per program). 4096 since after session 5's 14:30 run, with the
# quantisers' i32c indexing (the launcher's default): the measured `i32c` config, 1.00-1.43x the old default (the
# int64-indexed kernel with 8192-element tiles, which round 1 had made 1.06x over 4096 on that kernel) at 1 / 64 /
# 4,096 / 16,384 tokens (benchmarks/results/2026-11-30-s5r3-bench-tile_kernels-quant.json); same bits
PTGQ_TILE_ELEMS = 4096


def _check_tensor(name: str, x: object, dtypes: tuple[torch.dtype, ...], min_dim: int = 1) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name}: expected at least {min_dim} dims, got shape {tuple(x.shape)}")
    return x


def _check_block(name: str, block: object, extent: int | None = None, what: str = "last dim") -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise ValueError(f"{name}: expected a positive int, got {block!r}")
    if extent is not None and extent % block != 0:
        raise ValueError(f"{name}: {what} ({extent}) must be a multiple of {name} ({block})")
    return block


def _check_scale_fmt(scale_fmt: object) -> str:
    if scale_fmt not in _SCALE_FMTS:
        raise ValueError(f"scale_fmt: expected one of {_SCALE_FMTS}, got {scale_fmt!r}")
    return str(scale_fmt)


def _check_finite(name: str, x: torch.Tensor) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: expected finite values, got NaN or inf")


def _fp8_fast(x: torch.Tensor, block: int) -> bool:
    """The Triton per-group FP8 kernel takes CUDA fp32/bf16/fp16 input with a power-of-two block <= 4096."""
    return triton_float_ok(x) and block <= 4096 and block & (block - 1) == 0 and block >= 2


def _fp8_triton(
    x: torch.Tensor, block: int, mode: str, tile_elems: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    from .backends.cuda.triton_quant import fp8_group_quant_triton  # imports triton: only on this path

    return fp8_group_quant_triton(x, block, mode, tile_elems=tile_elems)


def fp8_quant_ue8m0(x: torch.Tensor, block: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise each contiguous `block` of the last dim to e4m3 with a power-of-two scale.

    x: float16/bfloat16/float32/float64 [..., n], n a multiple of `block` (math in fp32).
    Returns (q float8_e4m3fn [..., n], scale_exp int32 [..., n/block]) with x ~= q * 2^scale_exp.
    Blocks with NaN/inf: scale_exp 128 and q NaN throughout.
    """
    _check_tensor("x", x, _FLOAT_DTYPES)
    _check_block("block", block, x.shape[-1])
    if _fp8_fast(x, block):
        return _fp8_triton(x, block, "exp")
    return _ref.fp8_quant_ue8m0(x, block)


def fp8_quant_dequant_ue8m0(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """FP8 quantise-dequantise (the V4 KV "QAT" simulation at block 64; per-token activations at 128).

    x: float [..., n], n a multiple of `block`. Returns the same shape and dtype as x holding
    e4m3(x / 2^e) * 2^e per block. A block containing NaN or inf becomes all NaN.
    """
    _check_tensor("x", x, _FLOAT_DTYPES)
    _check_block("block", block, x.shape[-1])
    if _fp8_fast(x, block):
        return _fp8_triton(x, block, "dequant")[0]
    return _ref.fp8_quant_dequant_ue8m0(x, block)


def _fp4_triton(x: torch.Tensor, block: int, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    from .backends.cuda.triton_fp4 import fp4_group_quant_triton  # imports triton: only on this path

    return fp4_group_quant_triton(x, block, mode)


def fp4_quant_ue8m0(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise each contiguous `block` of the last dim to e2m1 codes with a power-of-two scale.

    x: float [..., n], n a multiple of `block`. Returns (codes uint8 [..., n] in 0..15, scale_exp int32
    [..., n/block]); code c means (-1)^(c>>3) * {0,.5,1,1.5,2,3,4,6}[c & 7] * 2^scale_exp. Ties go to the
    even code; the sign bit of x is kept (also for values rounding to zero). NaN elements get code 0 or 8
    (by their sign bit) and their block scale_exp 128 (the NaN marker).
    """
    _check_tensor("x", x, _FLOAT_DTYPES)
    _check_block("block", block, x.shape[-1])
    if _fp8_fast(x, block):  # same limits as the FP8 kernel: power-of-two block <= 4096
        return _fp4_triton(x, block, "codes")
    return _ref.fp4_quant_ue8m0(x, block)


def fp4_quant_dequant_ue8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP4 quantise-dequantise (the V4 indexer "QAT" simulation, block 32, after the Hadamard).

    x: float [..., n], n a multiple of `block`. Returns the same shape and dtype as x; a block
    containing NaN or inf becomes all NaN.
    """
    _check_tensor("x", x, _FLOAT_DTYPES)
    _check_block("block", block, x.shape[-1])
    if _fp8_fast(x, block):
        return _fp4_triton(x, block, "dequant")[0]
    return _ref.fp4_quant_dequant_ue8m0(x, block)


def hadamard_transform(x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Walsh-Hadamard transform over the last dim in Sylvester order: y = scale * H_n @ x.

    x: float [..., n], n a power of two. scale: defaults to n^-1/2 (orthonormal). fp32 butterflies;
    the result has x's shape and dtype. NaN propagates to every output of its row.
    """
    _check_tensor("x", x, _FLOAT_DTYPES)
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"x: last dim must be a power of two, got {n}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    if triton_float_ok(x) and 2 <= n <= _HADAMARD_MAX_N:
        from .backends.cuda.triton_hadamard import hadamard_triton  # imports triton: only on this path

        return hadamard_triton(x, scale)
    return _ref.hadamard_transform(x, scale)


def per_token_group_quant_fp8(
    x: torch.Tensor, group_size: int = 128, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group e4m3 activation quantisation (DeepGEMM's 1x128 activation scales).

    x: float [m, k] (leading dims beyond one are allowed), k a multiple of `group_size`.
    scale_fmt "ue8m0": scale = 2^ceil(log2(amax/448)); "fp32": scale = amax/448 (no rounding); amax is
    floored at 1e-4 in both. Returns (q float8_e4m3fn [m, k], scales float32 [m, k/group_size]) with
    x ~= q * scale per group. A group containing NaN (or inf) is all NaN in q; its scale is inf (ue8m0) or NaN.
    """
    _check_tensor("x", x, _FLOAT_DTYPES)
    _check_block("group_size", group_size, x.shape[-1])
    fmt = _check_scale_fmt(scale_fmt)
    if _fp8_fast(x, group_size):
        # PTGQ_TILE_ELEMS-element tiles (8 warps by the launcher's rule), i32c indexing (see PTGQ_TILE_ELEMS)
        return _fp8_triton(x, group_size, "pow2" if fmt == "ue8m0" else "fp32", PTGQ_TILE_ELEMS)
    return _ref.per_token_group_quant_fp8(x, group_size, fmt)


def _check_block2(block: object) -> tuple[int, int]:
    if not isinstance(block, (tuple, list)) or len(block) != 2:
        raise ValueError(f"block: expected a pair (rows, cols), got {block!r}")
    return (_check_block("block[0]", block[0]), _check_block("block[1]", block[1]))


def fp8_block_quant(
    w: torch.Tensor, block: tuple[int, int] = (128, 128), scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a weight to e4m3 with one scale per `block` tile (the official 128x128 FP8 format).

    w: float [n, k], finite; ragged edges allowed (partial tiles take their own amax).
    Returns (w_fp8 float8_e4m3fn [n, k], scale [ceil(n/b0), ceil(k/b1)]): torch.float8_e8m0fnu holding
    2^ceil(log2(amax/448)) for "ue8m0", float32 amax/448 for "fp32"; amax floored at 1e-4.
    """
    _check_tensor("w", w, _FLOAT_DTYPES, min_dim=2)
    if w.dim() != 2:
        raise ValueError(f"w: expected 2 dims [n, k], got shape {tuple(w.shape)}")
    block2 = _check_block2(block)
    fmt = _check_scale_fmt(scale_fmt)
    _check_finite("w", w)
    return _ref.fp8_block_quant(w, block2, fmt)


def dequant_fp8_block(
    w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (128, 128), dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise a block-scaled e4m3 weight: out[i, j] = w[i, j] * scale[i // b0, j // b1].

    w: float8_e4m3fn [n, k]. scale: float8_e8m0fnu or float [ceil(n/b0), ceil(k/b1)], same device.
    Returns `dtype` [n, k] (fp32 math; exact in fp32 for power-of-two scales). E8M0 byte 255 gives NaN.
    """
    _check_tensor("w", w, (torch.float8_e4m3fn,), min_dim=2)
    _check_tensor("scale", scale, (torch.float8_e8m0fnu,) + _FLOAT_DTYPES, min_dim=2)
    b0, b1 = _check_block2(block)
    if w.dim() != 2:
        raise ValueError(f"w: expected 2 dims [n, k], got shape {tuple(w.shape)}")
    want = (-(-w.shape[0] // b0), -(-w.shape[1] // b1))
    if tuple(scale.shape) != want:
        raise ValueError(
            f"scale: expected shape {want} for w {tuple(w.shape)} and block {(b0, b1)}, got {tuple(scale.shape)}"
        )
    if scale.device != w.device:
        raise ValueError(f"scale: expected device {w.device} (w's), got {scale.device}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    return _ref.dequant_fp8_block(w, scale, (b0, b1), dtype)


def fp4_pack(w: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a weight to packed e2m1 with one E8M0 scale per `block` inputs (the official FP4 expert format).

    w: float [n, k], finite, k a multiple of `block` and even. Returns (packed int8 [n, k/2], with
    element 2j in the low nibble and 2j+1 in the high nibble; scale float8_e8m0fnu [n, k/block]).
    Nibble codes as in `fp4_quant_ue8m0`.
    """
    _check_tensor("w", w, _FLOAT_DTYPES, min_dim=2)
    if w.dim() != 2:
        raise ValueError(f"w: expected 2 dims [n, k], got shape {tuple(w.shape)}")
    _check_block("block", block, w.shape[1])
    if w.shape[1] % 2:
        raise ValueError(f"w: last dim must be even to pack two codes per byte, got {w.shape[1]}")
    _check_finite("w", w)
    return _ref.fp4_pack(w, block)


def unpack_fp4(
    packed: torch.Tensor, scale: torch.Tensor, block: int = 32, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise packed e2m1: out[i, j] = code_value(nibble j of row i) * scale[i, j // block].

    packed: int8 or uint8 [n, k/2] (element 2j in the low nibble; codes 0..15 mean
    0,.5,1,1.5,2,3,4,6,-0,-.5,-1,-1.5,-2,-3,-4,-6). scale: float8_e8m0fnu or float [n, k/block], same
    device. Returns `dtype` [n, k].
    """
    _check_tensor("packed", packed, (torch.int8, torch.uint8), min_dim=2)
    _check_tensor("scale", scale, (torch.float8_e8m0fnu,) + _FLOAT_DTYPES, min_dim=2)
    k = packed.shape[-1] * 2
    _check_block("block", block, k, what="unpacked last dim")
    want = (*packed.shape[:-1], k // block)
    if tuple(scale.shape) != want:
        raise ValueError(
            f"scale: expected shape {want} for packed {tuple(packed.shape)} and block {block}, got {tuple(scale.shape)}"
        )
    if scale.device != packed.device:
        raise ValueError(f"scale: expected device {packed.device} (packed's), got {scale.device}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    return _ref.unpack_fp4(packed, scale, block, dtype)
