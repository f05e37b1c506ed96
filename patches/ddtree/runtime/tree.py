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


def prune_tree(tree: DraftTree, caps: torch.Tensor) -> DraftTree:
    """Each request's tree cut to its own budget: request ``b`` keeps the root and nodes ``1..caps[b]``, every other
    slot becomes an unused one (token 0, parent -1, depth 0, score -inf, no links), ``num_nodes`` at most
    ``caps[b] + 1``. Nodes are laid out in best-first order, so what is kept is exactly the tree a build at budget
    ``caps[b]`` gives (the same nodes, tokens and links); a cap of 0 keeps the root alone (the walk accepts nothing:
    one target token, as plain decoding). ``caps`` int [B] on the tree's device, >= 0; a cap at or above the tree's
    budget keeps it whole. Elementwise ops only: no host sync, fixed shapes (usable inside a CUDA graph)."""
    batch, n1 = tree.parent.shape
    if caps.shape != (batch,):
        raise ValueError(f"caps must be [B={batch}], got {tuple(caps.shape)}")
    cap = caps.to(device=tree.parent.device, dtype=torch.int64).view(batch, 1)
    keep = torch.arange(n1, device=tree.parent.device, dtype=torch.int64).view(1, n1) <= cap

    def linked(ptr: torch.Tensor) -> torch.Tensor:  # a link to a cut node (always a later index) is cut too
        return torch.where(keep & (ptr.to(torch.int64) <= cap), ptr, torch.full_like(ptr, -1))

    return DraftTree(
        token=torch.where(keep, tree.token, torch.zeros_like(tree.token)),
        parent=torch.where(keep, tree.parent, torch.full_like(tree.parent, -1)),
        depth=torch.where(keep, tree.depth, torch.zeros_like(tree.depth)),
        score=torch.where(keep, tree.score, torch.full_like(tree.score, float("-inf"))),
        first_child=linked(tree.first_child),
        next_sibling=linked(tree.next_sibling),
        num_nodes=torch.minimum(tree.num_nodes, (cap.view(batch) + 1).to(tree.num_nodes.dtype)),
        max_depth=tree.max_depth,
    )
