"""Public entry: tree-verify inputs for the whole batch (reference in :mod:`.verify_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .types import DraftTree, VerifyInputs
from .verify_ref import build_verify_inputs_torch


def build_verify_inputs(tree: DraftTree, committed_lens: torch.Tensor, impl: str = "auto") -> VerifyInputs:
    """Ancestor masks (bool and bit-packed), positions and retrieve arrays; one kernel launch on triton."""
    if use_triton(impl, tree.parent, committed_lens):
        from .verify_triton import build_verify_inputs_triton

        return build_verify_inputs_triton(tree, committed_lens)
    return build_verify_inputs_torch(tree, committed_lens)
