"""The draft side of a DDTree round: per-depth top-k over the target's LM head, then the tree.

DFLASH's drafter has no head of its own: it borrows the target's ``lm_head``. Where the chain takes one argmax per
position, DDTree needs each position's top-k log-probabilities normalised over the *whole* vocabulary (the tree's
scores are sums of them). With tensor parallelism each rank holds a vocab shard: it takes the top-k of its shard and
its shard's log-sum-exp, and only those (k values, k ids and one normaliser per position and rank) are gathered,
never full-vocab logits.

:class:`DraftTreeBuilder` runs top-k, the best-first tree build and the ancestor masks either eagerly or inside the
draft model's CUDA graph (a capture tail hook, like the base's folded greedy head): in the graph it writes fixed
buffers that the worker reads after replay. Context positions are not part of it (the worker adds the committed
lengths afterwards), so the graph needs nothing but the draft's hidden states and block ids.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)


def runtime():
    """The vendored DDTree runtime (torch + triton only)."""
    from sglang.srt.speculative import ddtree

    return ddtree


@dataclass(frozen=True)
class HeadShard:
    """Where this rank's rows of the LM head sit: base vocab [0, num_org), added vocab after the padding."""

    weight: torch.Tensor
    num_org: int
    num_org_padded: int
    num_added: int
    org_start: int
    added_start: int

    @classmethod
    def of(cls, lm_head: Any) -> "HeadShard":
        weight = lm_head.weight
        shard = getattr(lm_head, "shard_indices", None)
        if shard is None:
            rows = int(weight.shape[0])
            return cls(weight, rows, rows, 0, 0, rows)
        return cls(weight, int(shard.num_org_elements), int(shard.num_org_elements_padded),
                   int(shard.num_added_elements), int(shard.org_vocab_start_index),
                   int(shard.added_vocab_start_index))

    def logits(self, hs: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Logits over this shard's real rows (padding excluded) and, with added vocab, the local -> global id map
        (else None: global id = local index + org_start)."""
        if hs.dtype != self.weight.dtype:
            hs = hs.to(self.weight.dtype)
        logits = torch.matmul(hs, self.weight[: self.num_org].T)
        if self.num_added == 0:
            return logits, None
        added = torch.matmul(hs, self.weight[self.num_org_padded: self.num_org_padded + self.num_added].T)
        id_map = torch.cat([
            torch.arange(self.num_org, device=hs.device, dtype=torch.int64) + self.org_start,
            torch.arange(self.num_added, device=hs.device, dtype=torch.int64) + self.added_start,
        ])
        return torch.cat([logits, added], dim=-1), id_map


def merge_shard_topk(vals: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """Global top-k from every rank's top-k: ``vals``/``ids`` [tp, m, kk] (fp32 logits, global ids), ``lse``
    [tp, m] (each shard's log-sum-exp). Returns (log-probs fp32 [m, k], ids int64 [m, k]), descending, ties by
    ascending token id; missing ranks (k > tp * kk) are -inf / 0."""
    tp, m, kk = vals.shape
    total = torch.logsumexp(lse, dim=0)
    cand_v = vals.permute(1, 0, 2).reshape(m, tp * kk)
    cand_i = ids.permute(1, 0, 2).reshape(m, tp * kk)
    order = torch.argsort(cand_i, dim=-1, stable=True)
    cand_v, cand_i = cand_v.gather(1, order), cand_i.gather(1, order)
    top_v, top_p = torch.sort(cand_v, dim=-1, descending=True, stable=True)
    kg = min(k, tp * kk)
    out_lp = torch.full((m, k), float("-inf"), dtype=torch.float32, device=vals.device)
    out_id = torch.zeros((m, k), dtype=torch.int64, device=vals.device)
    out_lp[:, :kg] = top_v[:, :kg] - total[:, None]
    out_id[:, :kg] = cand_i.gather(1, top_p[:, :kg])
    return out_lp, out_id


def draft_topk(hidden: torch.Tensor, shard: HeadShard, k: int, tp_group: Any = None) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """Per-position top-k draft log-probs (fp32 [n, k]) and token ids (int64 [n, k]) over the whole vocabulary.

    Single rank: the runtime's ``draft_topk`` (one pass over the logits on the GPU: log-sum-exp and top-k). TP:
    the same pass gives the shard's top-k logits and log-sum-exp, one all-gather each, :func:`merge_shard_topk`. Sync-free; capturable with ``tp_group`` None or a
    group whose all-gather is.
    """
    rt = runtime()
    n = int(hidden.shape[0])
    logits, id_map = shard.logits(hidden)
    tp = 1 if tp_group is None else int(tp_group.world_size)
    if tp == 1:
        kk = min(k, int(logits.shape[-1]))
        lp, idx = rt.draft_topk(logits.unsqueeze(0), kk)
        lp, idx = lp[0], idx[0]
        ids = id_map[idx] if id_map is not None else idx + shard.org_start
        if kk == k:
            return lp, ids
        pad_lp = torch.full((n, k - kk), float("-inf"), dtype=lp.dtype, device=lp.device)
        return torch.cat([lp, pad_lp], 1), torch.cat([ids, torch.zeros_like(ids[:, : k - kk])], 1)
    kk = min(k, int(logits.shape[-1]))
    vals, idx, local_lse = rt.topk_logits_lse(logits, kk, sub_lse=False)  # one pass: raw logits + shard lse
    gids = id_map[idx] if id_map is not None else idx + shard.org_start
    g_vals = torch.empty((tp * n * kk,), dtype=torch.float32, device=hidden.device)
    g_ids = torch.empty((tp * n * kk,), dtype=torch.int64, device=hidden.device)
    g_lse = torch.empty((tp * n,), dtype=torch.float32, device=hidden.device)
    tp_group.all_gather_into_tensor(g_vals, vals.contiguous().view(-1))
    tp_group.all_gather_into_tensor(g_ids, gids.contiguous().view(-1))
    tp_group.all_gather_into_tensor(g_lse, local_lse.contiguous())
    return merge_shard_topk(g_vals.view(tp, n, kk), g_ids.view(tp, n, kk), g_lse.view(tp, n), k)


@dataclass
class DraftTreeOut:
    """One round's tree and ancestor masks, [bs, N1] unless noted (views of the builder's buffers in graph mode).

    ``positions`` are the nodes' depths; the worker adds the committed lengths.
    """

    tree: Any  # runtime DraftTree
    mask: torch.Tensor  # bool [bs, N1, N1]
    next_token: torch.Tensor  # int64: first child (-1 none)
    next_sibling: torch.Tensor  # int64: next sibling (-1 none)


class DraftTreeBuilder:
    """Draft hidden states -> per-depth top-k -> DDTree tree + masks, eager or folded into the draft CUDA graph.

    ``__call__(hidden_states, input_ids)`` is the capture tail hook body: it writes fixed buffers sized for
    ``max_bs`` requests, which :meth:`read` slices after a replay. :meth:`build` is the eager path (any batch size).
    A hook that passes no ``input_ids`` (0.5.15's ``dflash_draft_sampler``) gets the tree built with root token 0:
    the root's token is the only thing the build takes from them, so :meth:`read` writes the real roots in.
    """

    def __init__(self, *, lm_head: Any, block_size: int, budget: int, vocab_size: int, max_bs: int,
                 tp_group: Any = None, device: torch.device | str = "cuda"):
        self.shard = HeadShard.of(lm_head)
        self.block_size = int(block_size)
        self.depth = self.block_size - 1
        self.budget = int(budget)
        self.n1 = self.budget + 1
        self.k = min(self.budget, int(vocab_size))
        self.tp_group = tp_group if tp_group is not None and int(tp_group.world_size) > 1 else None
        self.max_bs = int(max_bs)
        n1, dev = self.n1, device
        i32 = dict(dtype=torch.int32, device=dev)
        self._token = torch.zeros((self.max_bs, n1), dtype=torch.int64, device=dev)
        self._parent = torch.full((self.max_bs, n1), -1, **i32)
        self._depth = torch.zeros((self.max_bs, n1), **i32)
        self._score = torch.zeros((self.max_bs, n1), dtype=torch.float32, device=dev)
        self._first = torch.full((self.max_bs, n1), -1, **i32)
        self._next = torch.full((self.max_bs, n1), -1, **i32)
        self._num = torch.zeros((self.max_bs,), **i32)
        self._mask = torch.zeros((self.max_bs, n1, n1), dtype=torch.bool, device=dev)
        self.roots_in_graph = True
        self.warmed = False

    def warm_up(self, device: torch.device | str) -> None:
        """One eager build on dummy inputs: compiles the kernels and copies the tree's candidate table to the
        device before any CUDA-graph capture (neither may happen inside a capture)."""
        hidden = torch.zeros((self.block_size, int(self.shard.weight.shape[1])), dtype=self.shard.weight.dtype,
                             device=device)
        self.build(hidden, torch.zeros((1,), dtype=torch.int64, device=device))
        self.warmed = True

    def build(self, hidden_states: torch.Tensor, root_tokens: torch.Tensor) -> DraftTreeOut:
        """Eager: ``hidden_states`` [bs * block_size, H] of the draft forward (position 0 is the root's)."""
        rt = runtime()
        bs = int(root_tokens.shape[0])
        hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(bs * self.depth, -1)
        lp, tok = draft_topk(hs, self.shard, self.k, self.tp_group)
        tree = rt.build_tree(lp.view(bs, self.depth, self.k), tok.view(bs, self.depth, self.k),
                             root_tokens.to(torch.int64), self.budget)
        vin = rt.build_verify_inputs(tree, torch.zeros((bs,), dtype=torch.int64, device=root_tokens.device))
        return DraftTreeOut(tree=tree, mask=vin.mask, next_token=vin.retrive_next_token,
                            next_sibling=vin.retrive_next_sibling)

    def __call__(self, hidden_states: torch.Tensor, input_ids: Optional[torch.Tensor] = None) -> None:
        """Capture-safe body: the same computation, results copied into the fixed buffers."""
        bs = int(hidden_states.shape[0]) // self.block_size
        self.roots_in_graph = input_ids is not None
        roots = (input_ids.view(bs, self.block_size)[:, 0] if input_ids is not None
                 else torch.zeros((bs,), dtype=torch.int64, device=hidden_states.device))
        out = self.build(hidden_states, roots)
        t = out.tree
        self._token[:bs].copy_(t.token)
        self._parent[:bs].copy_(t.parent)
        self._depth[:bs].copy_(t.depth)
        self._score[:bs].copy_(t.score)
        self._first[:bs].copy_(t.first_child)
        self._next[:bs].copy_(t.next_sibling)
        self._num[:bs].copy_(t.num_nodes)
        self._mask[:bs].copy_(out.mask)

    def read(self, bs: int, root_tokens: Optional[torch.Tensor] = None) -> DraftTreeOut:
        """The tree the last graph replay built for the first ``bs`` requests (views, no copy; the roots' tokens
        are copied in when the hook had no ``input_ids``)."""
        rt = runtime()
        if not self.roots_in_graph:
            if root_tokens is None:
                raise RuntimeError("DDTree: the draft graph built the tree without its root tokens; pass them")
            self._token[:bs, 0].copy_(root_tokens)
        tree = rt.DraftTree(token=self._token[:bs], parent=self._parent[:bs], depth=self._depth[:bs],
                            score=self._score[:bs], first_child=self._first[:bs], next_sibling=self._next[:bs],
                            num_nodes=self._num[:bs], max_depth=self.depth)
        return DraftTreeOut(tree=tree, mask=self._mask[:bs], next_token=self._first[:bs].to(torch.int64),
                            next_sibling=self._next[:bs].to(torch.int64))
