"""Pure-PyTorch references for every public tile_kernels op (tests, benchmarks, CPU fallback)."""

from .ref.act import swiglu_clamp
from .ref.compressor import softmax_pool
from .ref.fused import hadamard_fp4_quant_dequant, kv_norm_rope_quant, swiglu_clamp_fp8
from .ref.mhc import mhc_head, mhc_head_weights, mhc_post, mhc_pre, sinkhorn
from .ref.moe import hash_route, moe_permute, moe_route, moe_scores, moe_unpermute, stable_argsort
from .ref.norm import rms_norm
from .ref.rope import apply_rope_interleaved, rope_cos_sin, rope_inv_freq

__all__ = [
    "apply_rope_interleaved",
    "hadamard_fp4_quant_dequant",
    "hash_route",
    "kv_norm_rope_quant",
    "mhc_head",
    "mhc_head_weights",
    "mhc_post",
    "mhc_pre",
    "moe_permute",
    "moe_route",
    "moe_scores",
    "moe_unpermute",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
    "sinkhorn",
    "softmax_pool",
    "stable_argsort",
    "swiglu_clamp",
    "swiglu_clamp_fp8",
]
from .ref.quant import *  # noqa: E402,F401,F403
from .ref.quant import __all__ as _quant_all  # noqa: E402

__all__ += list(_quant_all)
