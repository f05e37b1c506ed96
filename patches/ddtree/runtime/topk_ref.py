"""Per-depth draft candidates: fp32 log-softmax over the full vocab, then top-k (plain torch).

The top-k is taken on the logits themselves (descending logit = descending log-prob), so a tensor-parallel rank
can select on its shard before the normaliser is known and the result is the same set. Ties are made
deterministic by sorting on one int64 key (logit order, then token id), because torch.topk alone leaves the
order of equal values (and which equal values make the cut) unspecified.
Every op is a fixed-shape device op: no host synchronisation, CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from .keys import score_from_sort_key, score_sort_key

TOKEN_BITS = 24  # vocabularies up to 16M tokens


def check_topk_args(vocab: int, k: int) -> None:
    """The one validation both implementations share: 1 <= k <= V < 2**TOKEN_BITS."""
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, V={vocab}], got {k}")
    if vocab >= 1 << TOKEN_BITS:
        raise ValueError(f"vocab {vocab} too large for {TOKEN_BITS}-bit token keys")


def topk_logits_lse_torch(logits: torch.Tensor, k: int, sub_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor,
                                                                                        torch.Tensor]:
    """[..., V] -> (values fp32 [..., k], tokens int64 [..., k], lse fp32 [...]); descending logit, ties by
    token id; values are log-probs when ``sub_lse``, else the fp32 logits."""
    vocab = logits.shape[-1]
    check_topk_args(vocab, k)
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    token_ids = torch.arange(vocab, device=x.device, dtype=torch.int64)
    key = (score_sort_key(x) << TOKEN_BITS) | token_ids
    best, _ = torch.topk(key, k, dim=-1, largest=False, sorted=True)
    vals = score_from_sort_key(best >> TOKEN_BITS)
    if sub_lse:
        vals = vals - lse.unsqueeze(-1)
    return vals, best & ((1 << TOKEN_BITS) - 1), lse


def draft_topk_torch(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, V] -> (logprobs fp32 [B, L, k], tokens int64 [B, L, k]); descending log-prob, ties by token id."""
    lp, tok, _ = topk_logits_lse_torch(draft_logits, k)
    return lp, tok
