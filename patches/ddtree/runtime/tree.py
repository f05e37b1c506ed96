"""Public entry: best-first DDTree construction (order and algorithm in :mod:`.tree_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .tree_ref import build_tree_torch
from .types import DraftTree


def build_tree(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, root_tokens: torch.Tensor, budget: int,
               impl: str = "auto") -> DraftTree:
    """The ``budget`` best prefix-closed nodes, laid out in key order (parents before children).

    Key: (-score, depth, parent's key, rank), score = fp32 parent-first sum of log-probs; this is exactly the
    node set and pop order of the paper's heap (Algorithm 1) under that tie-break.
    """
    if use_triton(impl, topk_logprobs, topk_tokens, root_tokens):
        from .tree_triton import build_tree_triton

        return build_tree_triton(topk_logprobs, topk_tokens, root_tokens, budget)
    return build_tree_torch(topk_logprobs, topk_tokens, root_tokens, budget)
