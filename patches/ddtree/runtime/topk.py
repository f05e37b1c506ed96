"""Public entry: per-depth top-k draft candidates (see :mod:`.topk_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .topk_ref import draft_topk_torch


def draft_topk(draft_logits: torch.Tensor, k: int, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-softmax over the full vocab, then top-k: (logprobs fp32 [B, L, k], tokens int64 [B, L, k]).

    Ranks are sorted by descending log-prob, ties by ascending token id. The triton path fuses the
    log-sum-exp and a chunked top-k (:mod:`.topk_triton`); both are sync-free.
    """
    if use_triton(impl, draft_logits):
        from .topk_triton import draft_topk_triton

        return draft_topk_triton(draft_logits, k)
    return draft_topk_torch(draft_logits, k)
