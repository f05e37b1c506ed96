"""Target-token selection and the acceptance walk in plain torch.

Lossless at T > 0: each node gets one independent draw from softmax(logits / T) (Gumbel-max), and the walk
commits target draws only, so committed tokens are distributed exactly as autoregressive sampling.
"""
from __future__ import annotations

import torch

from .types import DraftTree, WalkResult
from .verify_ref import walk_steps

GREEDY_T = 1e-5


def temperature_per_request(temperature: torch.Tensor | float, batch: int, device: torch.device) -> torch.Tensor:
    """Broadcast a float or [B] tensor of temperatures to fp32 [B] on ``device``."""
    if isinstance(temperature, torch.Tensor):
        return temperature.to(device=device, dtype=torch.float32).reshape(-1).expand(batch)
    return torch.full((batch,), float(temperature), device=device, dtype=torch.float32)


def sample_target_tokens_torch(target_logits: torch.Tensor, temperature: torch.Tensor | float,
                               generator: torch.Generator | None = None) -> torch.Tensor:
    """[B, N1, V] -> int64 [B, N1]: argmax where T < 1e-5, else argmax(logits / T + Gumbel noise)."""
    batch = target_logits.shape[0]
    x = target_logits.float()
    greedy = x.argmax(-1)
    if not isinstance(temperature, torch.Tensor) and float(temperature) < GREEDY_T:
        return greedy
    temp = temperature_per_request(temperature, batch, x.device)
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    gumbel = -torch.log(-torch.log(u))
    sampled = (x / temp.clamp(min=GREEDY_T).view(batch, 1, 1) + gumbel).argmax(-1)
    return torch.where((temp < GREEDY_T).view(batch, 1), greedy, sampled)


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
