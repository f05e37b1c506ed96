"""The acceptance walk as one Triton program per request.

The request's parent and token arrays stay in registers; each of the <= L steps is one vectorised match
(parent == current and token == target at current) plus a min-reduction, so no linked-list chasing and no
host round trip.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from .types import DraftTree, WalkResult
from .verify_ref import walk_steps


@triton.jit
def _walk_kernel(
    parent_ptr, token_ptr, target_ptr,
    nodes_ptr, len_ptr, toks_ptr, bonus_ptr,
    N1: tl.constexpr, STEPS: tl.constexpr, N1P: tl.constexpr, SP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, N1P)
    live = idx < N1
    par = tl.load(parent_ptr + b * N1 + idx, mask=live, other=-2)
    tok = tl.load(token_ptr + b * N1 + idx, mask=live, other=-1)
    slot = tl.arange(0, SP)
    nodes = tl.where(slot == 0, 0, -1)
    toks = tl.full([SP], -1, tl.int64)
    cur = tl.program_id(0) * 0  # int32 scalar: current node
    alive = cur + 1
    for s in range(STEPS + 1):
        t = tl.load(target_ptr + b * N1 + cur)
        toks = tl.where((slot == s) & (alive != 0), t, toks)
        match = (par == cur) & (tok == t) & (s < STEPS)
        nxt = tl.min(tl.where(match, idx, N1P))
        found = (nxt < N1P) & (alive != 0)
        nodes = tl.where((slot == s + 1) & found, nxt, nodes)
        cur = tl.where(found, nxt, cur)
        alive = found.to(tl.int32)
    out = slot <= STEPS
    tl.store(nodes_ptr + b * (STEPS + 1) + slot, nodes, mask=out)
    tl.store(toks_ptr + b * (STEPS + 1) + slot, toks, mask=out)
    tl.store(len_ptr + b, tl.sum(((slot >= 1) & out & (nodes >= 0)).to(tl.int32)))
    tl.store(bonus_ptr + b, tl.load(target_ptr + b * N1 + cur))


def accept_walk_triton(tree: DraftTree, target_tokens: torch.Tensor) -> WalkResult:
    batch, n1 = tree.parent.shape
    dev = tree.parent.device
    steps = walk_steps(tree)
    out = WalkResult(
        accepted_nodes=torch.empty((batch, steps + 1), device=dev, dtype=torch.int32),
        accept_len=torch.empty((batch,), device=dev, dtype=torch.int32),
        accepted_tokens=torch.empty((batch, steps + 1), device=dev, dtype=torch.int64),
        bonus_token=torch.empty((batch,), device=dev, dtype=torch.int64),
    )
    _walk_kernel[(batch,)](
        tree.parent.contiguous(), tree.token.contiguous(), target_tokens.to(torch.int64).contiguous(),
        out.accepted_nodes, out.accept_len, out.accepted_tokens, out.bonus_token,
        N1=n1, STEPS=steps, N1P=next_pow2(n1), SP=next_pow2(steps + 1),
        num_warps=4,
    )
    return out
