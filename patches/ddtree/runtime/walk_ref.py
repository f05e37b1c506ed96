"""The acceptance walk in plain torch: descend from the root while a child carries the target's token.

The walk commits target tokens only (see :mod:`.sample_ref` for how they are drawn), so it is lossless at any
temperature.
"""
from __future__ import annotations

import torch

from .types import DraftTree, WalkResult
from .verify_ref import walk_steps

def accept_walk_torch(tree: DraftTree, target_tokens: torch.Tensor) -> WalkResult:
    """Descend from the root while a child's token equals the target token at the current node."""
    batch, n1 = tree.parent.shape
    dev = tree.parent.device
    steps = walk_steps(tree)
    target = target_tokens.to(torch.int64)
    node_ids = torch.arange(n1, device=dev, dtype=torch.int64)
    cur = torch.zeros(batch, dtype=torch.int64, device=dev)
    alive = torch.ones(batch, dtype=torch.bool, device=dev)
    nodes = torch.full((batch, steps + 1), -1, dtype=torch.int64, device=dev)
    nodes[:, 0] = 0
    tokens = torch.full((batch, steps + 1), -1, dtype=torch.int64, device=dev)
    parent = tree.parent.to(torch.int64)
    for s in range(steps + 1):
        t = target.gather(1, cur.view(batch, 1)).view(batch)
        tokens[:, s] = torch.where(alive, t, tokens[:, s])
        if s == steps:
            break
        match = (parent == cur.view(batch, 1)) & (tree.token == t.view(batch, 1))
        nxt = torch.where(match, node_ids, n1).min(1).values
        alive = alive & (nxt < n1)
        nodes[:, s + 1] = torch.where(alive, nxt, -1)
        cur = torch.where(alive, nxt, cur)
    accept_len = (nodes[:, 1:] >= 0).sum(1).to(torch.int32)
    return WalkResult(accepted_nodes=nodes.to(torch.int32), accept_len=accept_len, accepted_tokens=tokens,
                      bonus_token=target.gather(1, cur.view(batch, 1)).view(batch))
