"""FP4 expert weights prepared for the W4A8 wide kernel (`csrc/cuda/dg_w4a8_wide.cuh`; pure PyTorch, any device).

`prepare_w4a8_wide(packed, scales)` runs once per weight (as DeepGEMM's `transform_weights_for_mega_moe`) and
returns a `W4A8WideWeights`: per (group, 256-row n tile, 128-deep k block) one 17,408-byte chunk that the kernel's
producer copies with one bulk copy and converts to e4m3 in shared memory, plus the fp32 128 x 128 block scales the
FP8 kernel's consumers already read. Format (exact, the kernel header's top comment):

- block exponent E = the largest E8M0 byte of the block's 128 rows x 4 groups of 32, over groups holding a nonzero
  code (a block of zeros: E = 127); each group's shift d = E - s (s: its own byte; 0 for groups of zeros);
- code c of a group is the e4m3 value c * 2^(6 - d): for d <= 11 every nonzero one is a NORMAL e4m3 number, and
  c * 2^(s - 127) = (c * 2^(6 - d)) * 2^(E - 133): block scale sfb = 2^(E - 133);
- the 8 codes k0..k7 of a 32-bit word sit in a permuted nibble order (`_SIGN_SOURCE`) so the kernel converts them
  with 7 instructions; chunk = 256 rows x 64 bytes of words, then the 1,024 shift bytes in producer-thread order.

`lossless` is False when some block spans more than MAX_SHIFT binades or holds the E8M0 NaN byte 255: the API then
runs the exact kernels on the original (packed, scales), which the object keeps. `dequant_w4a8_wide` decodes a
prepared weight the way the kernel does (CPU tests: it must equal the reference dequantisation bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...dequant import dequant_fp4_weight, fp4_codes

__all__ = ["CHUNK_BYTES", "MAX_SHIFT", "TILE_N", "W4A8WideWeights", "dequant_w4a8_wide", "e4m3_operand",
           "prepare_w4a8_wide", "reference_dequant"]

TILE_N = 256  # weight rows per chunk (the kernel's 128 x 256 tile)
BK = 128  # k per chunk (one block scale per 128 rows)
CODE_BYTES = TILE_N * BK // 2  # 16,384
CHUNK_BYTES = CODE_BYTES + TILE_N * BK // 32  # + one shift byte per group of 32 = 17,408
MAX_SHIFT = 11  # kW4MaxShift: the largest d keeping every stored weight a normal e4m3 number
_PRODUCER_THREADS = 128
# Nibble j of a word: magnitude bits of k_j, sign of k_SIGN_SOURCE[j] (odd j: k_(j-1)/2, even j: k_(4 + j/2)).
_SIGN_SOURCE = (4, 0, 5, 1, 6, 2, 7, 3)
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class W4A8WideWeights:
    """A prepared FP4 expert weight (see the module docstring).

    chunks: uint8 [g, n / 256, k / 128, CHUNK_BYTES]; sfb: float32 [g, n / 128, k / 128] = 2^(E - 133);
    lossless: every block fits the format (else the API uses `packed` / `scales`); packed, scales: the original
    operands (int8/uint8 [g, n, k / 2], E8M0 [g, n, k / 32]), kept for the exact kernels and the reference.
    """

    chunks: torch.Tensor
    sfb: torch.Tensor
    lossless: bool
    packed: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        """(g, n, k) of the weight."""
        g, n, kh = self.packed.shape
        return g, n, 2 * kh


def _check_operands(packed: torch.Tensor, scales: torch.Tensor) -> tuple[int, int, int]:
    if not isinstance(packed, torch.Tensor) or packed.dtype not in (torch.int8, torch.uint8) or packed.dim() != 3:
        got = f"{packed.dtype} {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"packed: expected an int8 / uint8 tensor [g, n, k / 2], got {got}")
    g, n, kh = packed.shape
    k = 2 * kh
    if n % TILE_N or k % BK or n == 0 or k == 0:
        raise ValueError(f"packed: expected n % {TILE_N} == 0 and k % {BK} == 0 (nonzero), got n={n}, k={k}")
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        got = scales.dtype if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise ValueError(f"scales: expected uint8 or float8_e8m0fnu E8M0 bytes, got {got}")
    if tuple(scales.shape) != (g, n, k // 32):
        raise ValueError(f"scales: expected shape {(g, n, k // 32)}, got {tuple(scales.shape)}")
    if scales.device != packed.device:
        raise ValueError(f"scales: expected device {packed.device} (packed's), got {scales.device}")
    return g, n, k


def _block_exponents(codes: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E [g, n / 128, k / 128], d [g, n, k / 32]) from codes [g, n, k] and int32 bytes s [g, n, k / 32]."""
    g, n, k = codes.shape
    zero = (codes & 7).view(g, n, k // 32, 32).amax(dim=-1) == 0  # groups of (signed) zeros
    s_eff = torch.where(zero, torch.full_like(s, -1), s)
    e = s_eff.view(g, n // 128, 128, k // BK, 4).amax(dim=(2, 4))
    e = torch.where(e < 0, torch.full_like(e, 127), e)
    e_full = e.repeat_interleave(128, dim=1).repeat_interleave(4, dim=2)  # [g, n, k / 32]
    d = torch.where(zero, torch.zeros_like(s), e_full - s)
    return e, d


def _permute_words(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., k] -> uint8 [..., k / 2]: each 8 codes as one little-endian word in the kernel's order."""
    c = codes.view(*codes.shape[:-1], -1, 8).to(torch.int32)
    src = torch.tensor(_SIGN_SOURCE, device=codes.device)
    nib = (c & 7) | (c.index_select(-1, src) & 8)  # [..., k / 8, 8] nibbles
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8).flatten(-2)


def _chunk(words: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """words uint8 [g, n, k / 2], d [g, n, k / 32] -> chunks uint8 [g, n / 256, k / 128, CHUNK_BYTES]."""
    g, n, kh = words.shape
    nt, kb = n // TILE_N, 2 * kh // BK
    code = words.view(g, nt, TILE_N, kb, BK // 2).permute(0, 1, 3, 2, 4).reshape(g, nt, kb, CODE_BYTES)
    # shift byte (row 32 i + t / 4, group t % 4) at 8 t + i: rows as (i, t / 4), groups t % 4 -> (t / 4, t % 4, i)
    dd = d.to(torch.uint8).view(g, nt, 8, _PRODUCER_THREADS // 4, kb, 4)
    dd = dd.permute(0, 1, 4, 3, 5, 2).reshape(g, nt, kb, TILE_N * 4)
    return torch.cat((code, dd), dim=-1).contiguous()


def prepare_w4a8_wide(packed: torch.Tensor, scales: torch.Tensor) -> W4A8WideWeights:
    """Prepare FP4 expert weights for the W4A8 wide kernel (once per weight; on the weight's device).

    packed: int8 / uint8 [g, n, k / 2] (low nibble = element 2j); scales: uint8 / float8_e8m0fnu [g, n, k / 32].
    n % 256 == 0, k % 128 == 0. Returns a `W4A8WideWeights` (its `lossless` says whether the kernel may take it).
    """
    g, n, k = _check_operands(packed, scales)
    dev = packed.device
    chunks = torch.empty(g, n // TILE_N, k // BK, CHUNK_BYTES, dtype=torch.uint8, device=dev)
    sfb = torch.empty(g, n // 128, k // BK, dtype=torch.float32, device=dev)
    bad = torch.zeros((), dtype=torch.bool, device=dev)
    for i in range(g):  # one group at a time: the int32 intermediates are ~16x the packed bytes
        codes = fp4_codes(packed[i : i + 1])
        s = scales[i : i + 1].view(torch.uint8).to(torch.int32)
        e, d = _block_exponents(codes, s)
        bad |= (d > MAX_SHIFT).any() | (s == 255).any()  # read once, after the loop (no sync per group)
        sfb[i] = torch.ldexp(torch.ones_like(e[0], dtype=torch.float32), (e[0] - 133).to(torch.float32))
        chunks[i] = _chunk(_permute_words(codes), d.clamp(0, MAX_SHIFT))[0]  # (not lossless: never run)
    return W4A8WideWeights(chunks=chunks, sfb=sfb, lossless=not bool(bad), packed=packed, scales=scales)


def _lut(device: torch.device) -> torch.Tensor:
    """int64 [16, 8]: e4m3 byte of magnitude j * 2^(6 - d) for d <= MAX_SHIFT, 0 above (the kernel's w4_init)."""
    d = torch.arange(16, device=device).view(16, 1).to(torch.float32)
    mag = torch.tensor(_MAGNITUDES, device=device).view(1, 8)
    v = torch.where(d <= MAX_SHIFT, mag * torch.exp2(6 - d), torch.zeros_like(mag))
    return v.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)


def _byte_perm(lut8: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """prmt with table lut8 [..., 8] (bytes) and the 4 low selector nibbles of sel [...] -> int64 word."""
    out = torch.zeros_like(sel)
    for j in range(4):
        out |= torch.gather(lut8, -1, ((sel >> (4 * j)) & 7).unsqueeze(-1)).squeeze(-1) << (8 * j)
    return out


def _decode_chunks(chunks: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """One group's chunks uint8 [nt, kb, CHUNK_BYTES] -> e4m3 bytes uint8 [nt * 256, kb * 128] (w4_convert)."""
    nt, kb = chunks.shape[:2]
    raw = chunks.to(torch.int64)
    words = raw[..., :CODE_BYTES].view(nt, kb, CODE_BYTES // 4, 4)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24  # [nt, kb, 4096]
    dd = raw[..., CODE_BYTES:].view(nt, kb, _PRODUCER_THREADS // 4, 4, 8).permute(0, 1, 4, 2, 3)
    d = dd.reshape(nt, kb, TILE_N, 4).repeat_interleave(4, dim=-1).reshape(nt, kb, CODE_BYTES // 4)
    lut8 = lut[d & 15]  # [nt, kb, 4096, 8]
    mag = words & 0x77777777
    lo = _byte_perm(lut8, mag) | (words & 0x80808080)
    hi = _byte_perm(lut8, mag >> 16) | ((words << 4) & 0x80808080)
    byts = torch.stack([(x >> (8 * j)) & 0xFF for x in (lo, hi) for j in range(4)], dim=-1)  # [.., 4096, 8]
    return byts.to(torch.uint8).view(nt, kb, TILE_N, BK).permute(0, 2, 1, 3).reshape(nt * TILE_N, kb * BK)


def e4m3_operand(w: W4A8WideWeights) -> torch.Tensor:
    """The e4m3 B operand the kernel's producer writes (w4_convert, emulated): float8_e4m3fn [g, n, k]; times the
    block scales sfb it is the weight. (The GPU tests feed it to the FP8 wide kernel: the outputs must be equal.)
    One group at a time (the int64 intermediates are ~30x the chunk bytes)."""
    g, n, k = w.shape
    lut = _lut(w.chunks.device)
    out = torch.empty(g, n, k, dtype=torch.uint8, device=w.chunks.device)
    for i in range(g):
        out[i] = _decode_chunks(w.chunks[i], lut)
    return out.view(torch.float8_e4m3fn)


def dequant_w4a8_wide(w: W4A8WideWeights) -> torch.Tensor:
    """Decode a prepared weight as the kernel does (w4_convert, then x sfb): float32 [g, n, k]."""
    scale = w.sfb.repeat_interleave(128, dim=1).repeat_interleave(BK, dim=2)
    return e4m3_operand(w).to(torch.float32) * scale


def reference_dequant(w: W4A8WideWeights) -> torch.Tensor:
    """The reference dequantisation of the original operands: float32 [g, n, k]."""
    sf = w.scales.view(torch.float8_e8m0fnu) if w.scales.dtype == torch.uint8 else w.scales
    return dequant_fp4_weight(w.packed, sf)
