"""Best-first DDTree construction in plain torch (the reference the Triton kernel is tested against).

Node order (the documented tie-break): every node is keyed by
    (-score, depth, key of its parent, rank)
where score is the fp32 sum of the path's log-probs accumulated parent-first
(score(child) = score(parent) + lp[d][r]). Log-probs are <= 0 and ranks are sorted by log-prob, so a node's
parent and elder sibling always come before it; the paper's heap (Algorithm 1) keyed this way therefore pops
nodes in exactly this order, and the tree is the first ``budget`` nodes in it.

Why "parent key" rather than "rank path" for equal scores: ordering equal-score, equal-depth nodes by their
parents' own order keeps child order consistent with parent order (child (j, s) never after child (i, r) when
parent j precedes i and s <= r), which the exact per-depth pruning below relies on. Under a rank-path tie-break
fp32 rounding can make a child of a better-scored parent tie with, and sort after, a child of a worse one.
The two tie-breaks differ only among equal-score nodes of one depth whose parents' score order differs from
their rank-path order (exact ties such as integer-valued log-probs, or rounding); on continuous inputs they agree
(tests/runtime/test_tree.py shows both cases).

Algorithm (exact, fixed shapes, no host sync): C_0 = {root}. For each depth d, C_d = the ``budget`` best
children of C_{d-1} (only pairs in :func:`keys.candidate_pairs` can qualify). The selected depth-d nodes are a
prefix of C_d, so the answer is the ``budget`` best of the union of the C_d, taken by one sort of global keys.
"""
from __future__ import annotations

import torch

from .keys import (
    CAND_SHIFT,
    GLOBAL_SHIFT,
    INVALID_KEY,
    MAX_BUDGET,
    MAX_DEPTH,
    RANK_BITS,
    RANK_MASK,
    candidate_index,
    score_from_sort_key,
    score_sort_key,
)
from .types import DraftTree


def check_build_args(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, root_tokens: torch.Tensor,
                     budget: int) -> tuple[int, int, int]:
    """Validate shapes shared by both builders; returns (B, L, k)."""
    if topk_logprobs.dim() != 3 or topk_tokens.shape != topk_logprobs.shape:
        raise ValueError("topk_logprobs and topk_tokens must both be [B, L, k]")
    batch, depth, k = topk_logprobs.shape
    if root_tokens.shape != (batch,):
        raise ValueError(f"root_tokens must be [B={batch}]")
    if not 1 <= budget <= MAX_BUDGET:
        raise ValueError(f"budget must be in [1, {MAX_BUDGET}], got {budget}")
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"L must be in [1, {MAX_DEPTH}], got {depth}")
    if k < 1:
        raise ValueError("need at least one candidate per depth")
    return batch, depth, k


def link_children(parent: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """first_child / next_sibling (int32 [B, N1]) from parent pointers, siblings in ascending index.

    One sort of (parent, index) keys groups siblings; neighbours in the sorted order give the links.
    """
    batch, n1 = parent.shape
    dev = parent.device
    idx = torch.arange(n1, device=dev, dtype=torch.int64).expand(batch, n1)
    key = torch.where(valid & (parent >= 0), parent.to(torch.int64) * (n1 + 1) + idx,
                      torch.full_like(idx, INVALID_KEY))
    skey, _ = torch.sort(key, dim=1)
    ok = skey != INVALID_KEY
    spar = torch.where(ok, skey // (n1 + 1), -1)
    sidx = torch.where(ok, skey % (n1 + 1), -1)
    nxt_par = torch.cat([spar[:, 1:], torch.full_like(spar[:, :1], -2)], dim=1)
    nxt_idx = torch.cat([sidx[:, 1:], torch.full_like(sidx[:, :1], -1)], dim=1)
    prv_par = torch.cat([torch.full_like(spar[:, :1], -2), spar[:, :-1]], dim=1)
    # scatter targets for invalid entries go to a dump column n1
    first_child = torch.full((batch, n1 + 1), -1, device=dev, dtype=torch.int64)
    is_first = ok & (prv_par != spar)
    first_child.scatter_(1, torch.where(is_first, spar, n1), torch.where(is_first, sidx, -1))
    next_sibling = torch.full((batch, n1 + 1), -1, device=dev, dtype=torch.int64)
    link = torch.where(ok & (nxt_par == spar), nxt_idx, -1)
    next_sibling.scatter_(1, torch.where(ok, sidx, n1), link)
    return first_child[:, :n1].to(torch.int32), next_sibling[:, :n1].to(torch.int32)


def build_tree_torch(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, root_tokens: torch.Tensor,
                     budget: int) -> DraftTree:
    """Plain-torch tree build; see the module docstring for the order and the algorithm."""
    batch, depth_l, k_in = check_build_args(topk_logprobs, topk_tokens, root_tokens, budget)
    dev = topk_logprobs.device
    n = budget
    k = min(k_in, n)
    lp = topk_logprobs.float()
    ci, cr = candidate_index(n, k, dev)
    m = ci.numel()

    p_score = torch.full((batch, n), float("-inf"), device=dev)
    p_score[:, 0] = 0.0
    p_valid = torch.zeros((batch, n), dtype=torch.bool, device=dev)
    p_valid[:, 0] = True
    depth_keys, depth_par, depth_rank = [], [], []
    for d in range(depth_l):
        cs = p_score[:, ci] + lp[:, d, cr]  # [B, M] fp32, parent-first accumulation
        ok = p_valid[:, ci]
        key = (score_sort_key(cs) << CAND_SHIFT) | (ci << RANK_BITS) | cr
        key = torch.where(ok, key, torch.full_like(key, INVALID_KEY))
        skey, _ = torch.sort(key, dim=1)
        if m < n:
            skey = torch.cat([skey, torch.full((batch, n - m), INVALID_KEY, device=dev, dtype=torch.int64)], 1)
        skey = skey[:, :n]
        p_valid = skey != INVALID_KEY
        score_key = skey >> CAND_SHIFT
        p_score = torch.where(p_valid, score_from_sort_key(score_key), float("-inf"))
        depth_par.append((skey >> RANK_BITS) & RANK_MASK)
        depth_rank.append(skey & RANK_MASK)
        pos = torch.arange(n, device=dev, dtype=torch.int64) + d * n
        gkey = (score_key << GLOBAL_SHIFT) | pos
        depth_keys.append(torch.where(p_valid, gkey, torch.full_like(gkey, INVALID_KEY)))

    gsorted, _ = torch.sort(torch.cat(depth_keys, dim=1), dim=1)
    sel_key = gsorted[:, :n]  # [B, N]
    sel = sel_key != INVALID_KEY
    flat = torch.where(sel, sel_key & ((1 << GLOBAL_SHIFT) - 1), 0)
    d_idx = flat // n  # depth - 1
    node_idx = torch.arange(1, n + 1, device=dev, dtype=torch.int64).expand(batch, n)
    node_of = torch.zeros((batch, depth_l * n + 1), dtype=torch.int64, device=dev)
    node_of.scatter_(1, torch.where(sel, flat, depth_l * n), node_idx)
    par_all = torch.stack(depth_par, 1).reshape(batch, -1)
    rank_all = torch.stack(depth_rank, 1).reshape(batch, -1)
    par_pos = par_all.gather(1, flat)
    rank = rank_all.gather(1, flat)
    par_flat = torch.clamp(d_idx - 1, min=0) * n + par_pos
    parent = torch.where(d_idx == 0, 0, node_of.gather(1, par_flat))
    tok_flat = topk_tokens.reshape(batch, -1).gather(1, d_idx * k_in + rank)

    root = torch.zeros((batch, 1), dtype=torch.int64, device=dev)
    token = torch.cat([root_tokens.view(batch, 1).to(torch.int64), torch.where(sel, tok_flat, 0)], 1)
    parent = torch.cat([root - 1, torch.where(sel, parent, -1)], 1).to(torch.int32)
    depth = torch.cat([root, torch.where(sel, d_idx + 1, 0)], 1).to(torch.int32)
    score = torch.cat([root.float(), torch.where(sel, score_from_sort_key(sel_key >> GLOBAL_SHIFT),
                                                 float("-inf"))], 1)
    valid = torch.cat([torch.ones_like(sel[:, :1]), sel], 1)
    first_child, next_sibling = link_children(parent, valid)
    num_nodes = valid.sum(1).to(torch.int32)
    return DraftTree(token=token, parent=parent, depth=depth, score=score, first_child=first_child,
                     next_sibling=next_sibling, num_nodes=num_nodes, max_depth=depth_l)
