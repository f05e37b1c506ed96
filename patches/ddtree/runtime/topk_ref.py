"""Per-depth draft candidates: fp32 log-softmax over the full vocab, then top-k (plain torch).

Ties are made deterministic by sorting on one int64 key (log-prob order, then token id), because torch.topk
alone leaves the order of equal values (and which equal values make the cut) unspecified.
Every op is a fixed-shape device op: no host synchronisation, CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from .keys import score_from_sort_key, score_sort_key

TOKEN_BITS = 24  # vocabularies up to 16M tokens


def draft_topk_torch(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, V] -> (logprobs fp32 [B, L, k], tokens int64 [B, L, k]); descending log-prob, ties by token id."""
    vocab = draft_logits.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, V={vocab}], got {k}")
    if vocab >= 1 << TOKEN_BITS:
        raise ValueError(f"vocab {vocab} too large for {TOKEN_BITS}-bit token keys")
    x = draft_logits.float()
    logprobs = x - torch.logsumexp(x, dim=-1, keepdim=True)
    token_ids = torch.arange(vocab, device=x.device, dtype=torch.int64)
    key = (score_sort_key(logprobs) << TOKEN_BITS) | token_ids
    best, _ = torch.topk(key, k, dim=-1, largest=False, sorted=True)
    tokens = best & ((1 << TOKEN_BITS) - 1)
    return score_from_sort_key(best >> TOKEN_BITS), tokens
