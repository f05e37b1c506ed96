"""The target-verify attention mask in SGLang's flattened per-request layout, in plain torch.

Attention backends that take a custom verify mask (triton's extend kernel, FlashInfer's ``plan``) read one
row-major ``[N1, prefix_b + N1]`` block per request ``b``, blocks back to back: request ``b`` starts at
``sum_{c<b} N1 * (prefix_c + N1)``, row ``i`` at ``+ i * (prefix_b + N1)``, and the tree columns sit after the
``prefix_b`` committed-context columns. Every context column is visible to every node.

Writing the context columns costs ``(prefix + N1) / N1`` times the tree block (about 500x at 32 K context and budget
64), and SGLang's triton extend kernel never reads them (it skips the prefix part of the mask). So the default here
writes only the ``N1 x N1`` tree block of each request; ``prefix_cols=True`` also writes the context columns as
visible, for readers that scan whole rows (FlashInfer, triton's deterministic kernel).
"""
from __future__ import annotations

import torch


def mask_offsets(prefix_lens: torch.Tensor, n1: int) -> torch.Tensor:
    """int64 [B]: where each request's block starts in the flat mask (exclusive prefix sum, on the device)."""
    seg = (prefix_lens.to(torch.int64) + n1) * n1
    return torch.cumsum(seg, 0) - seg


def mask_numel(prefix_sum: int, batch: int, n1: int) -> int:
    """Cells of the flat mask for ``batch`` requests whose context lengths sum to ``prefix_sum`` (host ints)."""
    return n1 * (int(prefix_sum) + int(batch) * n1)


def write_verify_mask_torch(tree_mask: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor, *,
                            prefix_cols: bool = False, max_prefix: int | None = None) -> torch.Tensor:
    """Write ``tree_mask`` (bool [B, N1, N1]) into the flat ``out`` (bool or uint8) in place; returns ``out``.

    ``max_prefix`` (a host upper bound of the longest context) is needed only with ``prefix_cols``.
    """
    batch, n1, _ = tree_mask.shape
    if batch == 0:
        return out
    dev = tree_mask.device
    prefix = prefix_lens.to(device=dev, dtype=torch.int64)
    row_len = prefix + n1
    start = mask_offsets(prefix, n1)
    i = torch.arange(n1, device=dev, dtype=torch.int64)
    rows = start[:, None] + i[None, :] * row_len[:, None]  # [B, N1]
    flat = out.view(-1)
    tree_idx = rows[:, :, None] + prefix[:, None, None] + i[None, None, :]
    flat[tree_idx.reshape(-1)] = tree_mask.reshape(-1).to(flat.dtype)
    if prefix_cols:
        if max_prefix is None:
            raise ValueError("prefix_cols=True needs max_prefix (a host upper bound of the context lengths)")
        cols = torch.arange(int(max_prefix), device=dev, dtype=torch.int64)
        keep = (cols[None, None, :] < prefix[:, None, None]).expand(batch, n1, cols.numel())
        ctx_idx = (rows[:, :, None] + cols[None, None, :])[keep]
        flat[ctx_idx] = torch.ones((), dtype=flat.dtype, device=dev)
    return out
