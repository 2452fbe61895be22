"""Fast paths. "triton": exact radix-select top-k on CUDA (`cuda/`): v3 `triton_filter.py` (one read of the row
in the common case; what `topk`, `topk_ragged` and `indexer_topk`'s selection run), v2 `triton_select.py`
(3 reads) and v1 `triton_topk.py` (5 reads, GPU-validated) as fallbacks, split rows `triton_split.py` for few
long rows (`cuda/dispatch.py` picks), and the fused
indexer scores + top-k `triton_indexer.py` (not wired into the API yet). `indexer_scores` and the score half of
`indexer_topk` run the reference."""

IMPLEMENTED: tuple[str, ...] = ("triton",)
