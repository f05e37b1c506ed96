"""Public entries: target-token selection and the acceptance walk (references in :mod:`.walk_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .types import DraftTree, WalkResult
from .sample_ref import sample_target_tokens_torch
from .walk_ref import accept_walk_torch


def sample_target_tokens(target_logits: torch.Tensor, temperature: torch.Tensor | float,
                         generator: torch.Generator | None = None, impl: str = "auto") -> torch.Tensor:
    """int64 [B, N1]: argmax where temperature < 1e-5, else one independent draw per node from softmax(x / T)."""
    if use_triton(impl, target_logits):
        from .sample_triton import sample_target_tokens_triton

        return sample_target_tokens_triton(target_logits, temperature, generator)
    return sample_target_tokens_torch(target_logits, temperature, generator)


def accept_walk(tree: DraftTree, target_tokens: torch.Tensor, impl: str = "auto") -> WalkResult:
    """From the root, descend to the child whose token equals the target token at the current node."""
    if use_triton(impl, tree.parent, target_tokens):
        from .walk_triton import accept_walk_triton

        return accept_walk_triton(tree, target_tokens)
    return accept_walk_torch(tree, target_tokens)
