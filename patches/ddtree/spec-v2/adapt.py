"""Online adaptation of a DDTree budget schedule (``--speculative-ddtree-adapt``), with no host synchronisation.

What is counted, on the GPU, in every tree round (a few small sync-free kernels after the walk):

- per depth ``d`` and sibling rank ``r``: ``obs[d][r]`` = tree nodes of rank ``r`` at depth ``d`` whose parent is on
  the accepted path (the target's token there is known), ``hits[d][r]`` = those whose token is the target's. Ranks
  come from the tree itself: siblings are numbered in descending draft probability (the best-first build), so a
  node's rank is the number of earlier siblings. ``hits / obs`` estimates ``accept_profile[d][r]`` of the runtime's
  cost model (``ddtree.schedule``), under its assumptions.
- per tree budget: tokens committed (sum of commit lengths); the request-rounds are counted on the host (the batch
  size is known there).

How it is read: every ``period`` rounds the counters are copied into pinned host memory with a non-blocking copy and
an event is recorded; a later round polls the event (``query()``, never a wait) and only then reads the copy. Nothing
in a round ever blocks on the GPU.

What it may change (bounds): only between what was captured at start-up. Each captured batch size keeps either its
start-up budget or drops to 0 (the chain: with adaptation on, the target's graphs at tree sizes are also captured at
the chain's width and the draft graph's tail there runs the chain's greedy head too, see ``graph_widths`` and
``draft_schedule``; that extra LM-head pass at tree sizes is what adaptation costs). A size runs its tree only while
the measured tokens per round of its budget pay the cost table's ratio over the chain: ``tokens(b) >= chain_tokens x
round_ms(b, bs) / round_ms(0, bs) x (1 + margin)``, the chain's tokens predicted from the measured rank-0 column
(unobserved cells take the start-up profile's value, which favours the chain). Every ``reprobe`` reads, sizes that
dropped to the chain run their tree again for one period, so a workload that changes can win them back.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

#: Sibling ranks tracked per depth (deeper ranks are rare in a best-first tree; they are not counted).
RANKS = 8


def _schedule_mod() -> Any:
    from sglang.srt.speculative.ddtree import schedule

    return schedule


def estimate_profile(hits: Sequence[Sequence[float]], obs: Sequence[Sequence[float]],
                     prior: Sequence[Sequence[float]], min_obs: float) -> list[list[float]]:
    """``hits / obs`` per (depth, rank), the prior's value where fewer than ``min_obs`` were observed; each depth
    scaled down if it sums above 1 (estimates of exclusive events)."""
    out = []
    for d in range(len(obs)):
        row = []
        for r in range(len(obs[d])):
            p_prior = prior[d][r] if d < len(prior) and r < len(prior[d]) else 0.0
            row.append(hits[d][r] / obs[d][r] if obs[d][r] >= min_obs else p_prior)
        total = sum(row)
        out.append([p / total for p in row] if total > 1.0 else row)
    return out


def decide(start: Mapping[int, int], *, profile: Sequence[Sequence[float]], tokens: Mapping[int, float],
           requests: Mapping[int, float], round_ms: Mapping[tuple[int, int], float], block_size: int,
           min_requests: float = 64, margin: float = 0.02) -> dict[int, int]:
    """Per captured batch size: its start-up budget, or 0 where the budget's tokens per round (measured when at
    least ``min_requests`` request-rounds ran it, else the cost model's from ``profile``) do not pay the cost
    table's ratio over the chain (see the module docstring). Pure: the unit the tests drive."""
    sched = _schedule_mod()
    chain = sched.chain_tokens_per_round(profile, block_size)
    out: dict[int, int] = {}
    for bs, b in start.items():
        if b <= 0:
            out[bs] = 0
            continue
        got = (tokens.get(b, 0.0) / requests[b] if requests.get(b, 0) >= min_requests
               else sched.expected_tokens_per_round(b, profile))
        need = chain * round_ms[(b, bs)] / round_ms[(0, bs)] * (1.0 + margin)
        out[bs] = b if got >= need else 0
    return out


def rank_cells(tree: Any, target: torch.Tensor, accepted_nodes: torch.Tensor,
               depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per tree node: its (depth, rank) cell ``(depth - 1) * RANKS + rank`` (flat, int64), whether it counts (its
    parent is on the accepted path, rank < RANKS) and whether it hit (its token is the target's there), as int64
    for ``index_add_``. A node's rank is the number of its earlier siblings (the best-first build numbers siblings in
    descending draft probability). Sync-free: fixed shapes, elementwise ops and gathers only."""
    bs, n1 = tree.parent.shape
    dev = tree.parent.device
    on_path = torch.zeros((bs, n1 + 1), dtype=torch.bool, device=dev)
    nodes = accepted_nodes.to(torch.int64)
    on_path.scatter_(1, torch.where(nodes >= 0, nodes, n1), True)
    on_path = on_path[:, :n1]
    parent = tree.parent.to(torch.int64)
    has_parent = parent >= 0
    p = parent.clamp(min=0)
    idx = torch.arange(n1, device=dev)
    valid = has_parent & (idx[None, :] < tree.num_nodes.to(torch.int64)[:, None])
    parent_on = on_path.gather(1, p) & valid
    hit = parent_on & (tree.token == target.to(torch.int64).gather(1, p))
    same = (parent[:, :, None] == parent[:, None, :]) & valid[:, None, :]
    earlier = idx[None, :] < idx[:, None]  # [j, i]: i before j
    rank = (same & earlier[None]).sum(-1)
    d = (tree.depth.to(torch.int64) - 1).clamp(0, depth - 1)
    counted = parent_on & (rank < RANKS)
    cell = (d * RANKS + rank.clamp(max=RANKS - 1)).view(-1)
    return cell, counted.view(-1).to(torch.int64), (hit & counted).view(-1).to(torch.int64)


class _HostEvent:
    """CPU stand-in for a CUDA event (the copy it follows was synchronous)."""

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Adaptation:
    """GPU counters, their rare non-blocking read, and the active budget per captured size."""

    def __init__(self, *, schedule: Any, block_size: int, sizes: Sequence[int], device: Any,
                 period: int = 256, reprobe: int = 16, min_obs: float = 32, margin: float = 0.02,
                 round_ms: Optional[Mapping[int, Mapping[int, float]]] = None,
                 event_factory: Optional[Callable[[], Any]] = None):
        sched = _schedule_mod()
        self.block = int(block_size)
        self.depth = self.block - 1
        self.sizes = sorted({int(s) for s in sizes}) or [1]
        self.start = {bs: int(schedule.budget_for(bs)) for bs in self.sizes}
        self.active = dict(self.start)
        self.budgets = sorted({b for b in self.start.values() if b > 0})
        self.period, self.reprobe, self.min_obs, self.margin = int(period), int(reprobe), float(min_obs), margin
        self.grid = sched.round_ms_grid(round_ms if round_ms is not None else sched.DEFAULT_ROUND_MS,
                                        self.budgets, self.sizes)
        self.prior = [list(row) + [0.0] * RANKS for row in sched.DEFAULT_ACCEPT_PROFILE[: self.depth]]
        self.prior += [[0.0] * RANKS] * (self.depth - len(self.prior))
        dev = torch.device(device)
        n = 2 * self.depth * RANKS + len(self.budgets)
        self.buf = torch.zeros((n,), dtype=torch.int64, device=dev)
        self.obs = self.buf[: self.depth * RANKS]
        self.hits = self.buf[self.depth * RANKS: 2 * self.depth * RANKS]
        self.tokens = self.buf[2 * self.depth * RANKS:]
        pin = dev.type == "cuda"
        self.host = torch.zeros((n,), dtype=torch.int64, pin_memory=pin)
        self.event_factory = event_factory or ((lambda: torch.cuda.Event()) if pin else _HostEvent)
        self.requests = {b: 0 for b in self.budgets}
        self._pending: Optional[tuple[Any, dict[int, int]]] = None
        self._last = torch.zeros((n,), dtype=torch.int64)
        self._last_req = dict(self.requests)
        self.acc_buf = torch.zeros((n,), dtype=torch.float64)  # decayed sums of the deltas (host)
        self.acc_req = {b: 0.0 for b in self.budgets}
        self.rounds = 0
        self.reads = 0
        self.decisions = 0
        self.probing = False

    def budget_for(self, padded_bs: int, default: int) -> int:
        """The active budget of a captured size (``default`` for sizes not captured: they run eagerly)."""
        return self.active.get(int(padded_bs), default)

    # -- in the round (GPU work only) -----------------------------------------------------------------------------
    def record(self, tree: Any, target: torch.Tensor, accepted_nodes: torch.Tensor, commit_lens: torch.Tensor,
               budget: int) -> None:
        """Count one tree round (see the module docstring); sync-free: fixed shapes, weighted index_add."""
        bs = tree.parent.shape[0]
        cell, counted, hit = rank_cells(tree, target, accepted_nodes, self.depth)
        self.obs.index_add_(0, cell, counted)
        self.hits.index_add_(0, cell, hit)
        if budget in self.requests:
            k = self.budgets.index(budget)
            self.tokens[k: k + 1] += commit_lens.to(torch.int64).sum().view(1)
            self.requests[budget] += int(bs)

    # -- host side, every round (no device reads but a polled event) ----------------------------------------------
    def tick(self) -> None:
        """Called once per round: start a snapshot every ``period`` rounds; apply one whose copy has landed."""
        self.rounds += 1
        if self._pending is not None and self._pending[0].query():
            self._apply(self._pending[1])
            self._pending = None
        if self._pending is None and self.rounds % self.period == 0:
            self.host.copy_(self.buf, non_blocking=True)
            event = self.event_factory()
            event.record()
            self._pending = (event, dict(self.requests))

    def _apply(self, requests: dict[int, int]) -> None:
        snap = self.host.clone()
        delta = (snap - self._last).to(torch.float64)
        self._last = snap
        self.acc_buf = 0.5 * self.acc_buf + delta  # each read weighs the last period as much as all before it
        for b in self.budgets:
            self.acc_req[b] = 0.5 * self.acc_req[b] + (requests[b] - self._last_req[b])
        self._last_req = requests
        self.reads += 1
        dr = self.depth * RANKS
        obs = self.acc_buf[:dr].view(self.depth, RANKS).tolist()
        hits = self.acc_buf[dr: 2 * dr].view(self.depth, RANKS).tolist()
        profile = estimate_profile(hits, obs, self.prior, self.min_obs)
        tokens = {b: float(self.acc_buf[2 * dr + k]) for k, b in enumerate(self.budgets)}
        if self.reprobe and self.reads % self.reprobe == 0 and self.active != self.start:
            new, self.probing = dict(self.start), True
        else:
            new = decide(self.start, profile=profile, tokens=tokens, requests=self.acc_req, round_ms=self.grid,
                         block_size=self.block, min_requests=self.min_obs, margin=self.margin)
            self.probing = False
        if new != self.active:
            self.decisions += 1
            logger.info("DDTree adapt (read %d%s): budgets per batch size %s -> %s", self.reads,
                        ", re-probing" if self.probing else "", self.active, new)
        self.active = new
