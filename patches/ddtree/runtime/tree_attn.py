"""Public entry: tree-verify attention over the paged KV cache (reference in :mod:`.tree_attn_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .tree_attn_ref import tree_verify_attention_torch

__all__ = ["tree_verify_attention"]


def tree_verify_attention(q: torch.Tensor, k_ext: torch.Tensor, v_ext: torch.Tensor, o: torch.Tensor,
                          k_buf: torch.Tensor, v_buf: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                          kv_indices: torch.Tensor, mask: torch.Tensor, mask_indptr: torch.Tensor, sm_scale: float,
                          max_len: int, *, splits: int | None = None, impl: str = "auto") -> torch.Tensor:
    """Attention of each request's verified tokens to its whole context and, through the tree mask (SGLang's flat
    layout, tree block only), to each other; written into ``o`` and returned. ``max_len``: the verify width, a
    bound of every request's token count (a host int, fixed inside a CUDA graph). No host sync on the triton
    path; ``splits`` (default: from the batch size and the GPU) fixes how many programs share one context."""
    if use_triton(impl, q, k_buf, kv_indices):
        from .tree_attn_triton import tree_verify_attention_triton

        return tree_verify_attention_triton(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                            mask, mask_indptr, sm_scale, max_len, splits)
    return tree_verify_attention_torch(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask,
                                       mask_indptr, sm_scale)
