"""deepinfer.tile_kernels: fused building blocks of the DeepSeek-V4 forward
(norms, RoPE, mHC, SwiGLU, FP8/FP4 quant, MoE gates and token permutation).

Public functions come from ``api.py`` (shapes, dtypes and layouts in their docstrings). ``backend(device)``
names the implementation a call on that device runs; ``build_info()`` says what the wheel was built for.
"""

# _backend first: api.py may import `backend` from the package while it loads.
from ._backend import backend, build_info, package_version
from .api import *  # noqa: F401,F403
from .api import __all__ as _api_all

# The version pip installed; "0.2.0" (keep equal to pyproject.toml, a test checks) from the source tree.
__version__: str = package_version("0.2.0")

__all__ = [*_api_all, "backend", "build_info"]
