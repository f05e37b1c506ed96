"""Committing the accepted path without moving KV: reorder each request's verify slots, path first.

The target's verify forward writes node ``i``'s KV at the slot ``req_to_token[prefix + i]``. After the walk, the
committed positions ``prefix + j`` (``j`` < commit length) must hold the KV of the ``j``-th node of the accepted
path. With a page size of 1 every position can point at any slot, so instead of copying KV across every layer we
permute the slot indices of the verify range: the accepted path's slots first, in path order, then the request's
other verify slots in node order. The set of slots a request owns is unchanged (nothing leaks, nothing is shared),
only their order. Plain torch, no host sync, the same on CPU and GPU.
"""
from __future__ import annotations

import torch


def path_first_slot_order(accepted_nodes: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """int64 [B, N1]: each row of ``slots`` (the verify range's slots, node order) reordered path first.

    ``accepted_nodes`` is the walk's int [B, L+1]: node 0 (the root) first, then the accepted path, -1 padding.
    Row ``b`` of the result starts with ``slots[b, accepted_nodes[b, j]]`` for every valid ``j`` and continues with
    the remaining slots in ascending node index.
    """
    batch, n1 = slots.shape
    width = accepted_nodes.shape[1]
    dev = slots.device
    nodes = accepted_nodes.to(device=dev, dtype=torch.int64)
    valid = nodes >= 0
    # key(node) = its path position if accepted, else width + node: sorting by it puts the path first, in order.
    key = torch.arange(n1, device=dev, dtype=torch.int64).add(width).expand(batch, n1).contiguous()
    key = torch.cat([key, key.new_zeros((batch, 1))], 1)  # column n1 absorbs the padding entries
    pos = torch.arange(width, device=dev, dtype=torch.int64).expand(batch, width)
    key.scatter_(1, torch.where(valid, nodes, n1), torch.where(valid, pos, 0))
    order = torch.argsort(key[:, :n1], dim=1)
    return slots.to(torch.int64).gather(1, order)


def gather_path(values: torch.Tensor, accepted_nodes: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """values[b, accepted_nodes[b, j]] for j < width: [B, width, ...]; padding entries read node 0 (callers mask
    them by the commit length). ``values`` is [B, N1, ...]; ``width`` defaults to the path width L + 1 and may be
    larger (extra columns read node 0 too)."""
    batch, n1 = values.shape[:2]
    nodes = accepted_nodes.to(device=values.device, dtype=torch.int64).clamp(min=0)
    if width is not None and width != nodes.shape[1]:
        if width < nodes.shape[1]:
            nodes = nodes[:, :width]
        else:
            nodes = torch.cat([nodes, nodes.new_zeros((batch, width - nodes.shape[1]))], 1)
    idx = nodes.view(batch, -1, *([1] * (values.dim() - 2))).expand(batch, nodes.shape[1], *values.shape[2:])
    return values.gather(1, idx)
