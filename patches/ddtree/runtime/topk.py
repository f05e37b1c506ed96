"""Public entry: per-depth top-k draft candidates (see :mod:`.topk_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .topk_ref import topk_logits_lse_torch


def topk_logits_lse(logits: torch.Tensor, k: int, sub_lse: bool = True,
                    impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., V] -> (values fp32 [..., k], tokens int64 [..., k], log-sum-exp fp32 [...]).

    Values are log-probs (``sub_lse``) or the raw fp32 logits (what a tensor-parallel rank gathers with its
    shard's log-sum-exp). Ranks by descending logit, ties by ascending token id. The triton path reads the
    logits about once (threshold then gather, :mod:`.topk_select_triton`, with the exact streaming kernel of
    :mod:`.topk_triton` for rows that overflow its candidate buffer); both are sync-free.
    """
    if use_triton(impl, logits):
        from .topk_select_triton import topk_logits_lse as fused

        return fused(logits, k, sub_lse=sub_lse)
    return topk_logits_lse_torch(logits, k, sub_lse=sub_lse)


def draft_topk(draft_logits: torch.Tensor, k: int, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-softmax over the full vocab, then top-k: (logprobs fp32 [B, L, k], tokens int64 [B, L, k]).

    Ranks are sorted by descending log-prob (= descending logit), ties by ascending token id.
    """
    lp, tok, _ = topk_logits_lse(draft_logits, k, impl=impl)
    return lp, tok
