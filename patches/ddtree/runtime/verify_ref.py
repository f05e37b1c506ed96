"""Tree-verify inputs in plain torch: ancestor masks, depth positions and SGLang's retrieve arrays.

The mask is built by following parent pointers ``max_depth`` times for every node at once (each step is a
batched gather + scatter), so the cost is O(L * B * N1) work plus writing the mask, with no per-request loop.
"""
from __future__ import annotations

import torch

from .types import DraftTree, VerifyInputs


def pack_mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [..., N1] -> int32 [..., ceil(N1/32)], bit (j % 32) of word j // 32 (two's complement words)."""
    n1 = mask.shape[-1]
    words = (n1 + 31) // 32
    padded = torch.zeros(mask.shape[:-1] + (words * 32,), dtype=torch.int64, device=mask.device)
    padded[..., :n1] = mask.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=mask.device) << torch.arange(32, device=mask.device)
    value = (padded.view(mask.shape[:-1] + (words, 32)) * weights).sum(-1)
    return torch.where(value >= 1 << 31, value - (1 << 32), value).to(torch.int32)


def walk_steps(tree: DraftTree) -> int:
    """How many parent hops reach the root from any node: L when known, else N1 - 1."""
    return tree.max_depth if tree.max_depth > 0 else tree.parent.shape[1] - 1


def build_verify_inputs_torch(tree: DraftTree, committed_lens: torch.Tensor) -> VerifyInputs:
    batch, n1 = tree.parent.shape
    dev = tree.parent.device
    positions = committed_lens.view(batch, 1).to(torch.int64) + tree.depth.to(torch.int64)
    parent = tree.parent.to(torch.int64)
    mask = torch.zeros((batch, n1, n1 + 1), dtype=torch.bool, device=dev)  # column n1 absorbs "no ancestor"
    cur = torch.arange(n1, device=dev, dtype=torch.int64).expand(batch, n1).clone()
    for _ in range(walk_steps(tree) + 1):
        mask.scatter_(2, torch.where(cur >= 0, cur, n1).unsqueeze(-1), True)
        cur = torch.where(cur >= 0, parent.gather(1, cur.clamp(min=0)), -1)
    mask = mask[:, :, :n1].contiguous()
    rows = torch.arange(batch, device=dev, dtype=torch.int64).view(batch, 1) * n1
    return VerifyInputs(
        positions=positions,
        mask=mask,
        packed_mask=pack_mask_bits(mask),
        retrive_index=rows + torch.arange(n1, device=dev, dtype=torch.int64),
        retrive_next_token=tree.first_child.to(torch.int64),
        retrive_next_sibling=tree.next_sibling.to(torch.int64),
    )
