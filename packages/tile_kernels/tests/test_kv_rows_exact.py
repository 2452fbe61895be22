"""kv_norm_rope_quant's 1-warp row tilings (bt2_w1, bt4_w1 and the prepared size rule KV_ROWS_RULE) give the
default's bits, not only one ulp of it.

The only reduction of the KV entry is the RMSNorm's fp32 sum of 512 squares (amax is exact in any order, the rest is
elementwise). Its order is fixed by how the tile's layout spreads one row over registers, lanes and warps: the
default is one row per 1-warp program; with one warp and BLOCK_T rows, each row keeps that spread (checked on the
sm_90 TTGIR by tk_kv_layout.py), so each row is added in the default's order. The interpreter sums each row with
numpy, so the CPU tests check the launch logic, the tails and the cache writes bit for bit, and that the inputs are
order-sensitive (fp32 rows: another summation order changes most outputs); the GPU tests check the bits themselves
at V4's shapes (1 / 4,096 / 16,384 tokens), and that a tiling which splits a row over two warps is caught.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel modules
pytest.importorskip("triton")

_HERE = pathlib.Path(__file__).resolve().parent
DEV = "cuda" if _CUDA else "cpu"
D, ROPE = 512, 64
TILINGS = {"bt2_w1": {"block_t": 2, "num_warps": 1}, "bt4_w1": {"block_t": 4, "num_warps": 1}}


def _fused():  # noqa: ANN202 (a module)
    mod = "deepinfer.tile_kernels.backends.cuda.triton_fused"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])  # re-decorate under the interpreter
    return importlib.import_module(mod)


_F = _fused()


def kv_inputs(t: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    """kv [t, 512] (dtype) with rows of six kinds by row index % 6: randn * 3; a wide dynamic range (each element
    randn * 2^U(-30, 30): order-sensitive sums); one huge element (2^20) among randn ones (absorption); tiny
    (randn * 1e-19: squares near fp32's smallest normals); huge (randn * 1e18: the sum of squares can overflow to
    inf); bf16-extreme magnitudes (+-2^(+-60 .. +-120) by element). weight [512] around 1, cos / sin [t, 32] fp32."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, D, generator=g)
    kind = torch.arange(t)[:, None] % 6
    wide = x * torch.exp2(torch.randint(-30, 31, (t, D), generator=g).float())
    spike = torch.where(torch.arange(D)[None, :] == 7, torch.full_like(x, 2.0**20), x)
    ext = torch.sign(x) * torch.exp2(torch.randint(60, 121, (t, D), generator=g).float() * torch.sign(x))
    rows = (x * 3.0, wide, spike, x * 1e-19, x * 1e18, ext)
    kv = rows[0]
    for k in range(1, 6):
        kv = torch.where(kind == k, rows[k], kv)
    w = torch.randn(D, generator=g) * 0.5 + 1.0
    ang = torch.rand(t, ROPE // 2, generator=g) * 6.28
    return kv.to(dtype).to(DEV), w.to(dtype).to(DEV), ang.cos().to(DEV), ang.sin().to(DEV)


def _equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bitwise equality (NaN == NaN); names the count and first difference."""
    g, w = (x.view(torch.int16 if x.element_size() == 2 else torch.int32) for x in (got, want))
    diff = (g != w) & ~(torch.isnan(got.float()) & torch.isnan(want.float()))
    if diff.any():
        i = diff.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {diff.numel()} elements differ, first at {i}: "
            f"got {got[i[0], i[1]].item()!r}, default {want[i[0], i[1]].item()!r}"
        )


def check_rows_exact(t: int, dtype: torch.dtype = torch.bfloat16, seed: int = 5) -> None:
    """The rule (forced on) and bt2_w1 / bt4_w1 against the default at t tokens: quantised (blocks of 64) and
    unquantised entries, and the quantised entry written into a cache at shuffled rows (some negative: skipped)."""
    run = _F.kv_norm_rope_quant_triton
    kv, w, cos, sin = kv_inputs(t, seed, dtype)
    variants = {"rule": {"row_rule": True}, **TILINGS}
    for qb in (64, None):
        want = run(kv, w, cos, sin, ROPE, 1e-6, qb, row_rule=False)
        for name, kw in variants.items():
            _equal(run(kv, w, cos, sin, ROPE, 1e-6, qb, **kw), want, f"t={t} {dtype} qb={qb} {name}")
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(seed))
    rows = torch.where(perm % 5 == 3, -1, perm).to(DEV)  # every fifth target skipped
    cache0 = torch.randn(t, D, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(DEV)
    want = run(kv, w, cos, sin, ROPE, 1e-6, 64, out=cache0.clone(), rows=rows, row_rule=False)
    for name, kw in variants.items():
        got = run(kv, w, cos, sin, ROPE, 1e-6, 64, out=cache0.clone(), rows=rows, **kw)
        _equal(got, want, f"t={t} {dtype} cache {name}")


class _Recorder:
    """Stands in for the @triton.jit kernel: records the launch's grid and keyword arguments."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __getitem__(self, grid: tuple):  # noqa: ANN204
        return lambda *args, **kw: self.calls.append({"grid": grid, **kw})


def test_rule_is_on_by_default_and_picks_its_tiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off (DEEPINFER_TK_KV_ROWS=0): 1 token / 1 warp at every count. On (the default): 4 tokens per 1-warp program
    from 16,384 tokens, 2 from 4,096, the default below; d != 512 and explicit block_t / num_warps unaffected."""
    assert _F.KV_ROWS_RULE_ON == (os.environ.get("DEEPINFER_TK_KV_ROWS", "1") != "0")
    assert _F.KV_ROWS_RULE == ((16384, 4), (4096, 2))
    rec = _Recorder()
    monkeypatch.setattr(_F, "_kv_fused_kernel", rec)
    monkeypatch.setattr(_F, "KV_ROWS_RULE_ON", False)
    run = _F.kv_norm_rope_quant_triton

    def launch(t: int, d: int = D, **kw: object) -> tuple[int, int, int]:
        kv = torch.empty(t, d, dtype=torch.bfloat16, device=DEV)  # never read: the kernel is the recorder
        cs = torch.empty(t, ROPE // 2, device=DEV)
        run(kv, torch.empty(d, dtype=torch.bfloat16, device=DEV), cs, cs, ROPE, **kw)
        c = rec.calls[-1]
        return c["grid"][0], c["BLOCK_T"], c["num_warps"]

    assert [launch(t) for t in (1, 4096, 16384)] == [(1, 1, 1), (4096, 1, 1), (16384, 1, 1)]
    assert launch(16384, row_rule=True) == (4096, 4, 1)
    monkeypatch.setattr(_F, "KV_ROWS_RULE_ON", True)  # the default (DEEPINFER_TK_KV_ROWS unset or != "0")
    assert [launch(t) for t in (1, 64, 4095, 4096, 16383, 16384)] == [
        (1, 1, 1),
        (64, 1, 1),
        (4095, 1, 1),
        (2048, 2, 1),
        (8192, 2, 1),
        (4096, 4, 1),
    ]
    assert launch(16384, row_rule=False) == (16384, 1, 1)
    assert launch(16384, block_t=2, num_warps=2) == (8192, 2, 2)  # a named config wins over the rule
    assert launch(16384, d=1024) == (16384, 1, 2)  # a row over two warps: the rule does not apply


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the huge rows' squares (numpy)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_tilings_match_default(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """The rule with small thresholds (9 tokens: 4 per program with a tail of 1; 7: 2 per program, a tail of 1)
    and bt2_w1 / bt4_w1, bit for bit against the default, extreme rows (all six kinds) included."""
    monkeypatch.setattr(_F, "KV_ROWS_RULE", ((8, 4), (6, 2)))
    for t in (9, 7):
        check_rows_exact(t, dtype, seed=t)


def test_inputs_are_order_sensitive() -> None:
    """The power of the bit-for-bit checks: on these rows (fp32), summing the squares in another order (lanes of
    16 columns then a tree over lanes, vs a sequential pass) changes the normalised fp32 entry in a quarter of the
    rows or more, so a tiling that reorders a row's sum is caught on the GPU (where the interpreter's numpy order
    does not apply)."""
    kv = kv_inputs(48, seed=3, dtype=torch.float32)[0].cpu()
    sq = kv * kv
    seq = torch.zeros(48)
    for j in range(D):  # sequential fp32 adds
        seq = seq + sq[:, j]
    lanes = sq.view(48, 2, 32, 8).permute(0, 2, 1, 3).reshape(48, 32, 16)
    acc = lanes[:, :, 0]
    for j in range(1, 16):
        acc = acc + lanes[:, :, j]
    while acc.shape[1] > 1:  # xor butterfly 16, 8, 4, 2, 1
        h = acc.shape[1] // 2
        acc = acc[:, :h] + acc[:, h:]
    tree = acc[:, 0]
    finite = torch.isfinite(seq) & (seq > 0)
    y_seq, y_tree = kv / torch.sqrt(seq / D + 1e-6)[:, None], kv / torch.sqrt(tree / D + 1e-6)[:, None]
    rows_diff = ((y_seq != y_tree).any(1) & finite).sum().item()
    assert rows_diff >= finite.sum().item() // 4, f"only {rows_diff} of {int(finite.sum())} rows order-sensitive"


def test_rows_layout_matches_default_on_sm90() -> None:
    """Compiled for sm_90 (Triton here; the GPU's Triton may differ: the GPU tests check the bits), the sum of
    squares of bt2_w1 / bt4_w1 spreads each row as the default does, and bt2_w2 (a row over two warps) does not."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(_HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(_HERE / "tk_kv_layout.py")], env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    if proc.returncode and ("ptxas" in out or "No module named" in out):
        pytest.skip(f"Triton's CUDA compiler is not usable here: {out[-300:]}")
    assert proc.returncode == 0, out[-3000:]
    got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    def row_spread(lay: dict) -> tuple:  # how one row lies over registers, lanes, warps (and one row per lane/warp)
        return tuple(lay[k][1] for k in ("sizePerThread", "threadsPerWarp", "warpsPerCTA")) + (
            lay["threadsPerWarp"][0],
            lay["warpsPerCTA"][0],
            tuple(lay["order"]),
            lay["shape"][1],
        )

    default = row_spread(next(g for g in got if g["bt"] == 1 and g["quant"]))
    assert default == (8, 32, 1, 1, 1, (1, 0), 512), got  # 8 columns a lane, 32 lanes, one warp per row
    for g in got:
        same = row_spread(g) == default
        assert same == (g["warps"] == 1), f"bt{g['bt']}_w{g['warps']} quant={g['quant']}: {g} vs {default}"


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 4096, 16384])
def test_gpu_rows_tilings_bit_exact_v4(t: int) -> None:
    """V4's KV entry (kv [t, 512] bf16, rope 64, FP8 blocks of 64) and fp32 kv: the rule (forced on), bt2_w1 and
    bt4_w1 give the default's bits, quantised, unquantised and written into a cache."""
    for dtype in (torch.bfloat16, torch.float32):
        check_rows_exact(t, dtype, seed=t)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_row_order_change_is_visible() -> None:
    """The negative control of the test above: bt2_w2 splits each row over two warps (another sum order), and on
    these fp32 rows that changes the unquantised entry, so the bit-for-bit check can see an order change."""
    kv, w, cos, sin = kv_inputs(4096, seed=11, dtype=torch.float32)
    run = _F.kv_norm_rope_quant_triton
    want = run(kv, w, cos, sin, ROPE, 1e-6, None, row_rule=False)
    got = run(kv, w, cos, sin, ROPE, 1e-6, None, block_t=2, num_warps=2)
    rows_diff = int(((got != want) & ~(got.isnan() & want.isnan())).any(1).sum())
    print(f"bt2_w2 vs default, fp32 [4096, 512]: {rows_diff} rows differ")
    assert rows_diff > 0, "bt2_w2 matched the default bit for bit: the bit-exact test above may have no power"
