"""Fast paths (`cuda/`, selection only; `indexer_scores` and the score half of `indexer_topk` run the reference).

"cuda": the CUDA C++ radix top-k (`csrc/cuda/topk_radix.cu` -> `_C`, launched by `cuda/cuda_topk.py`), what
`topk`, `topk_ragged` and `indexer_topk`'s selection run when the package was built with DEEPINFER_DEVICE=cuda.
"triton": exact radix-select top-k in Triton, the fallback of "cuda" and what runs without `_C`: v3
`triton_filter.py` (one read of the row in the common case), v2 `triton_select.py` (3 reads) and v1
`triton_topk.py` (5 reads) as fallbacks, split rows `triton_split.py` for few long rows (`cuda/dispatch.py`
picks), and the fused indexer scores + top-k `triton_indexer.py` (not wired into the API yet)."""

IMPLEMENTED: tuple[str, ...] = ("cuda", "triton")
