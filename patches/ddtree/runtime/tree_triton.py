"""Best-first DDTree construction as one Triton program per request (grid = B).

Same algorithm, keys and output as :mod:`.tree_ref` (read its docstring for why it is exact):
per depth, the candidate children (parent position i, rank r) with (i + 1)(r + 1) <= N are scored, the
N best (bitonic top-k on packed int64 keys) become that depth's list, and a top-N over the per-depth lists
(once at the end when they fit one block, else a running merge per depth) yields the selected nodes in key
order. Each depth reads its parents' scores either with an in-register
``tl.gather`` (USE_GATHER) or through a per-request scratch row in global memory ordered by CTA barriers
(bar.sync makes a CTA's global writes visible to the CTA); the final parent/link resolution always uses scratch.
The next depth's log-probs are prefetched while the current depth sorts.
No host synchronisation and fixed shapes: the launch can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from ._triton_keys import score_from_key, score_key, smallest
from .keys import candidate_pairs, candidate_table
from .tree_ref import check_build_args
from .types import DraftTree

INVALID = tl.constexpr((1 << 63) - 1)


@triton.jit
def _build_tree_kernel(
    lp_ptr, tok_ptr, root_ptr, table_ptr,
    token_ptr, parent_ptr, depth_ptr, score_ptr, first_ptr, next_ptr, num_ptr,
    s_score_ptr, s_valid_ptr, s_par_ptr, s_rank_ptr, s_node_ptr, s_link_ptr, s_glob_ptr,
    K_IN, L: tl.constexpr,
    N: tl.constexpr, NP: tl.constexpr, MP: tl.constexpr, N1P: tl.constexpr, GP: tl.constexpr,
    USE_GATHER: tl.constexpr, MERGE_AT_END: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    N1: tl.constexpr = N + 1
    offs = tl.arange(0, NP)
    lp_row = lp_ptr + b * L * K_IN
    tok_row = tok_ptr + b * L * K_IN
    s_score = s_score_ptr + b * NP
    s_valid = s_valid_ptr + b * NP
    s_par = s_par_ptr + b * L * NP
    s_rank = s_rank_ptr + b * L * NP
    s_node = s_node_ptr + b * L * NP
    s_link = s_link_ptr + b * NP
    s_glob = s_glob_ptr + b * GP

    packed = tl.load(table_ptr + tl.arange(0, MP))
    t_ok = packed >= 0
    ci = (packed >> 16).to(tl.int64)
    cr = (packed & 0xFFFF).to(tl.int64)

    # C_0 = {root}: score 0
    p_sc = tl.where(offs == 0, 0.0, float("-inf"))
    p_ok_reg = (offs == 0).to(tl.int32)
    if not USE_GATHER:
        tl.store(s_score + offs, p_sc)
        tl.store(s_valid + offs, p_ok_reg)
    best = tl.full([NP], INVALID, tl.int64)  # running global top-N keys, ascending
    ci_safe = tl.where(t_ok, ci, 0).to(tl.int32)
    lp_next = tl.load(lp_row + cr, mask=t_ok, other=0.0)
    tl.debug_barrier()
    for d in range(0, L):
        lp = lp_next
        lp_next = tl.load(lp_row + (d + 1) * K_IN + cr, mask=t_ok & (d + 1 < L), other=0.0)  # prefetch
        if USE_GATHER:  # C_{d-1} stays in registers
            p_score = tl.gather(p_sc, ci_safe, 0)
            p_ok = tl.gather(p_ok_reg, ci_safe, 0)
        else:
            p_score = tl.load(s_score + ci, mask=t_ok, other=float("-inf"))
            p_ok = tl.load(s_valid + ci, mask=t_ok, other=0)
        child = p_score + lp  # fp32, parent-first accumulation (same op as the reference)
        key = tl.where(t_ok & (p_ok != 0), (score_key(child) << 22) | (ci << 11) | cr, INVALID)
        top = smallest(key, NP)  # this depth's list C_d, ascending
        ok = top != INVALID
        skey = top >> 22
        p_sc = tl.where(ok, score_from_key(skey), float("-inf"))
        p_ok_reg = ok.to(tl.int32)
        if not USE_GATHER:
            tl.debug_barrier()  # every read of C_{d-1} is done before it is overwritten
            tl.store(s_score + offs, p_sc)
            tl.store(s_valid + offs, p_ok_reg)
        tl.store(s_par + d * NP + offs, ((top >> 11) & 2047).to(tl.int32))
        tl.store(s_rank + d * NP + offs, (top & 2047).to(tl.int32))
        gkey = tl.where(ok & (offs < N), (skey << 16) | (d * NP + offs), INVALID)
        if MERGE_AT_END:
            tl.store(s_glob + d * NP + offs, gkey)
        else:
            best = smallest(tl.reshape(tl.join(best, gkey), [2 * NP]), NP)
        if not USE_GATHER:
            tl.debug_barrier()
    if MERGE_AT_END:  # one top-N over all L lists instead of L running merges
        tl.debug_barrier()
        g_offs = tl.arange(0, GP)
        best = smallest(tl.load(s_glob + g_offs, mask=g_offs < L * NP, other=INVALID), NP)

    sel = (offs < N) & (best != INVALID)
    flat = tl.where(sel, best & 0xFFFF, 0)
    dm1 = flat // NP
    node = offs + 1
    tl.store(s_node + flat, node.to(tl.int32), mask=sel)
    # links start empty; filled after the barrier below
    o1 = tl.arange(0, N1P)
    out_row = b * N1
    tl.store(first_ptr + out_row + o1, tl.full([N1P], -1, tl.int32), mask=o1 < N1)
    tl.store(next_ptr + out_row + o1, tl.full([N1P], -1, tl.int32), mask=o1 < N1)
    tl.debug_barrier()
    par_pos = tl.load(s_par + flat, mask=sel, other=0)
    rank = tl.load(s_rank + flat, mask=sel, other=0)
    up = tl.load(s_node + (dm1 - 1) * NP + par_pos, mask=sel & (dm1 > 0), other=0)
    parent = tl.where(dm1 == 0, 0, up)
    tok = tl.load(tok_row + dm1 * K_IN + rank, mask=sel, other=0)
    live = offs < N
    tl.store(token_ptr + out_row + node, tl.where(sel, tok, 0), mask=live)
    tl.store(parent_ptr + out_row + node, tl.where(sel, parent, -1), mask=live)
    tl.store(depth_ptr + out_row + node, tl.where(sel, dm1 + 1, 0).to(tl.int32), mask=live)
    tl.store(score_ptr + out_row + node, tl.where(sel, score_from_key(best >> 16), float("-inf")), mask=live)
    tl.store(token_ptr + out_row, tl.load(root_ptr + b))
    tl.store(parent_ptr + out_row, -1)
    tl.store(depth_ptr + out_row, 0)
    tl.store(score_ptr + out_row, 0.0)
    tl.store(num_ptr + b, 1 + tl.sum(sel.to(tl.int32)))

    # children links: sort (parent, node) pairs; neighbours in that order are siblings
    link = tl.sort(tl.where(sel, parent.to(tl.int64) * 2048 + node, INVALID))
    tl.store(s_link + offs, link)
    tl.debug_barrier()
    nxt = tl.load(s_link + offs + 1, mask=offs + 1 < NP, other=INVALID)
    prv = tl.load(s_link + offs - 1, mask=offs > 0, other=INVALID)
    has = link != INVALID
    l_par = link >> 11
    l_node = link & 2047
    tl.store(first_ptr + out_row + l_par, l_node.to(tl.int32), mask=has & ((prv >> 11) != l_par))
    tl.store(next_ptr + out_row + l_node, (nxt & 2047).to(tl.int32),
             mask=has & (nxt != INVALID) & ((nxt >> 11) == l_par))


USE_GATHER_DEFAULT = False
MERGE_AT_END_MAX = 4096  # merge all L lists at the end when they fit one block of this many keys


def build_tree_triton(topk_logprobs: torch.Tensor, topk_tokens: torch.Tensor, root_tokens: torch.Tensor,
                      budget: int, use_gather: bool | None = None, merge_at_end: bool | None = None,
                      num_warps: int | None = None) -> DraftTree:
    """Launch knobs (all give identical trees; defaults chosen from H200 measurements, see bench/results):
    ``use_gather``: read parents' scores with tl.gather instead of scratch memory;
    ``merge_at_end``: one final top-N over the L per-depth lists (else a running merge per depth);
    ``num_warps``: warps per request's program.
    """
    batch, depth_l, k_in = check_build_args(topk_logprobs, topk_tokens, root_tokens, budget)
    dev = topk_logprobs.device
    n = budget
    k = min(k_in, n)
    np_ = next_pow2(n)
    m = len(candidate_pairs(n, k))
    mp = next_pow2(m, np_)
    table = candidate_table(n, k, mp, dev)
    lp = topk_logprobs.float().contiguous()
    tok = topk_tokens.to(torch.int64).contiguous()
    roots = root_tokens.to(torch.int64).contiguous()
    n1 = n + 1
    i32 = dict(device=dev, dtype=torch.int32)
    out = DraftTree(
        token=torch.empty((batch, n1), device=dev, dtype=torch.int64),
        parent=torch.empty((batch, n1), **i32),
        depth=torch.empty((batch, n1), **i32),
        score=torch.empty((batch, n1), device=dev, dtype=torch.float32),
        first_child=torch.empty((batch, n1), **i32),
        next_sibling=torch.empty((batch, n1), **i32),
        num_nodes=torch.empty((batch,), **i32),
        max_depth=depth_l,
    )
    s_score = torch.empty((batch, np_), device=dev, dtype=torch.float32)
    s_valid = torch.empty((batch, np_), **i32)
    s_par = torch.empty((batch, depth_l * np_), **i32)
    s_rank = torch.empty((batch, depth_l * np_), **i32)
    s_node = torch.empty((batch, depth_l * np_), **i32)
    s_link = torch.empty((batch, np_), device=dev, dtype=torch.int64)
    gp = next_pow2(depth_l * np_)
    if merge_at_end is None:
        merge_at_end = gp <= MERGE_AT_END_MAX
    s_glob = torch.empty((batch, gp if merge_at_end else 1), device=dev, dtype=torch.int64)
    if num_warps is None:
        num_warps = 4 if mp <= 1024 else 8
    _build_tree_kernel[(batch,)](
        lp, tok, roots, table,
        out.token, out.parent, out.depth, out.score, out.first_child, out.next_sibling, out.num_nodes,
        s_score, s_valid, s_par, s_rank, s_node, s_link, s_glob,
        k_in, L=depth_l,
        N=n, NP=np_, MP=mp, N1P=next_pow2(n1), GP=gp,
        USE_GATHER=USE_GATHER_DEFAULT if use_gather is None else bool(use_gather), MERGE_AT_END=bool(merge_at_end),
        num_warps=num_warps,
    )
    return out
