"""Public entry: the flat target-verify mask in SGLang's layout (reference and layout in :mod:`.mask_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .mask_ref import mask_numel, mask_offsets, write_verify_mask_torch

__all__ = ["mask_numel", "mask_offsets", "write_verify_mask"]


def write_verify_mask(tree_mask: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor, *,
                      prefix_cols: bool = False, max_prefix: int | None = None, impl: str = "auto") -> torch.Tensor:
    """Write each request's ancestor mask (bool [B, N1, N1]) into the flat ``out`` (bool or uint8, at least
    ``mask_numel`` cells) in place. Only the tree block by default; ``prefix_cols`` also marks the context columns
    visible (needs ``max_prefix``, a host bound of the longest context). No host sync on the triton path."""
    if out.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"out must be bool or uint8, got {out.dtype}")
    if use_triton(impl, tree_mask, prefix_lens, out):
        from .mask_triton import write_verify_mask_triton

        return write_verify_mask_triton(tree_mask, prefix_lens, out, prefix_cols=prefix_cols, max_prefix=max_prefix)
    return write_verify_mask_torch(tree_mask, prefix_lens, out, prefix_cols=prefix_cols, max_prefix=max_prefix)
