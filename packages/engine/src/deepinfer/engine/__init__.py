"""DeepInfer engine: offline DeepSeek-V4 inference (`LLM(...).generate(...)`, `deepinfer generate`)."""

from __future__ import annotations

from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling_params import SamplingParams


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("deepinfer")
    except Exception:  # running from the source tree
        return "0.1.1"


__version__ = _version()
__all__ = ["LLM", "CompletionOutput", "Logprob", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # LLM pulls in the model and kernels; import it on first use so `import deepinfer.engine` stays light.
    if name == "LLM":
        from .llm import LLM

        return LLM
    raise AttributeError(f"module 'deepinfer.engine' has no attribute {name!r}")
