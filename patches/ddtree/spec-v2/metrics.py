"""DDTree's metrics on SGLang (every spec-v2 base): per request in ``meta_info``, server-wide on ``/metrics``, with no
host synchronisation added to a round. The names, the per-request summary and what a round adds to each counter are
the runtime's (``sglang.srt.speculative.ddtree.metrics``), shared with the reference engine and the control side.

**In the round** (the worker; nothing waits for the GPU): :meth:`RoundMetrics.begin` when the round's budget is
picked (``DDTreeRound.tree_round``, or the start of ``finish_round`` on the bases without schedules): a host record of
the round (batch size, budget, verify width, whether it is the chain) and, with ``/metrics`` on, a timing event
recorded on the stream. In a tree round, with ``/metrics`` on, :meth:`RoundMetrics.count` adds the round's
per-(depth, rank) counts to a device tensor (elementwise ops and ``index_add_``) and starts a non-blocking copy of it
into pinned host memory; :meth:`RoundMetrics.attach` puts the record on the round's result.

**Where it is read** (the scheduler): the hook after ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens``
(:func:`on_resolved`). SGLang calls it once per decode result after it has waited for that round itself (the overlap
scheduler's ``copy_done`` event, or a blocking copy) and holds the accept lengths on the host, so the copy started in
the round has landed and the events have completed (both are checked with ``query()``, never waited for). From the
accept lengths and the record: each request's round entry (``[budget, accepted, drafted, chain]``), appended to its
``customized_info`` under ``ddtree_round`` on the first token the round committed, the way SGLang carries per-token
values to the tokenizer process (0.5.15+; 0.5.14's output streamer does not align them per request: ``bases.py``
``meta_info``); and, on the scheduler that reports SGLang's own metrics, the server-wide counters through
``prometheus_client`` with SGLang's labels, so ``/metrics`` shows them beside SGLang's families (SGLang must run
with ``--enable-metrics``, as for its own). A chain round's result is SGLang's own: its record is matched in
launch order (the oldest unread record of a chain round of that batch size).

**Per request**: the hook after ``TokenizerManager._calculate_spec_decoding_metrics`` (:func:`finish_meta_info`,
called once a request finishes, beside SGLang's ``spec_accept_length`` etc.) replaces the per-token entries with
the summary (``ddtree_accept_length``, ``ddtree_accepted_per_depth``, ``ddtree_budget`` {min, median, max},
``ddtree_chain_rounds``, ...). Streamed chunks before the last carry the raw ``ddtree_round`` list.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .adapt import RANKS, rank_cells

logger = logging.getLogger(__name__)

#: Unread records kept at most (results SGLang never processes, e.g. at shutdown, are dropped past this).
MAX_PENDING = 256


def _metrics_mod() -> Any:
    from sglang.srt.speculative.ddtree import metrics

    return metrics


@dataclass
class RoundRecord:
    """What the host knows of one decode round when it is launched."""

    seq: int
    bs: int
    budget: int
    width: int
    chain: bool
    stamp: Any = None  # a CUDA event (timing) or a host time, with /metrics on
    caps: Optional[list[int]] = None  # per request, the budget its tree kept (None: the round's)
    ranks: Optional[torch.Tensor] = None  # pinned host copy of the cumulative [2, depth, RANKS] counts
    ranks_ready: Any = None  # the event after that copy
    attached: bool = False


class RoundMetrics:
    """One DFLASH worker's side of the metrics: the records of launched rounds and the device counters."""

    def __init__(self, *, block_size: int, export: bool):
        self.block = int(block_size)
        self.depth = self.block - 1
        self.export = bool(export)  # SGLang's --enable-metrics: server-wide counters and timing
        self.seq = 0
        self.open: Optional[RoundRecord] = None  # the round being launched
        self.pending: deque[RoundRecord] = deque(maxlen=MAX_PENDING)
        self.prev: Optional[RoundRecord] = None  # the last record read (for the round time)
        self.counts: Optional[torch.Tensor] = None  # device [2, depth, RANKS] int64: observed, accepted

    # -- in the round (no host reads of device values) --------------------------------------------------------
    def begin(self, bs: int, budget: int) -> RoundRecord:
        self.seq += 1
        width = int(budget) + 1 if budget > 0 else self.block
        rec = RoundRecord(seq=self.seq, bs=int(bs), budget=int(budget), width=width, chain=budget == 0)
        if self.export:
            rec.stamp = _stamp()
        self.open = rec
        self.pending.append(rec)
        return rec

    def ensure(self, bs: int, budget: int) -> RoundRecord:
        """The record of the tree round being run (begun by ``tree_round``, or now on bases without it)."""
        rec = self.open
        if rec is None or rec.attached or rec.chain or rec.bs != int(bs):
            rec = self.begin(bs, budget)
        return rec

    def count(self, tree: Any, target: torch.Tensor, accepted_nodes: torch.Tensor) -> None:
        """Add a tree round's per-(depth, rank) counts (``adapt.rank_cells``) on the device and start copying the
        cumulative counts to pinned host memory (read after SGLang's own wait for the round)."""
        rec = self.open
        if not self.export or rec is None:
            return
        dev = tree.parent.device
        if self.counts is None or self.counts.device != dev:
            self.counts = torch.zeros((2, self.depth * RANKS), dtype=torch.int64, device=dev)
        cell, counted, hit = rank_cells(tree, target, accepted_nodes, self.depth)
        self.counts[0].index_add_(0, cell, counted)
        self.counts[1].index_add_(0, cell, hit)
        rec.ranks, rec.ranks_ready = _host_copy(self.counts)

    def attach(self, result: Any, caps: Optional[list[int]] = None) -> Any:
        rec = self.open
        if rec is not None:
            rec.caps = caps
            rec.attached = True
            result.ddtree_round = rec
        return result

    # -- where SGLang has synchronised ------------------------------------------------------------------------------
    def take(self, result: Any, bs: int) -> Optional[RoundRecord]:
        """The record of the round ``result`` came from: its own (a tree round), else the oldest unread record of
        a chain round of ``bs`` requests (older unread records are dropped: their results were never read)."""
        rec = getattr(result, "ddtree_round", None)
        if rec is not None:
            while self.pending and self.pending[0].seq <= rec.seq:
                self.pending.popleft()
            return rec
        while self.pending:
            head = self.pending.popleft()
            if head.chain and head.bs == bs:
                return head
        return None

    def round_seconds(self, rec: RoundRecord) -> Optional[tuple[int, float]]:
        """(width, seconds) of the previous round read, timed from its start to ``rec``'s, when the two ran back to
        back on the same batch (consecutive rounds, same size); None otherwise or when an event is not done."""
        prev, self.prev = self.prev, rec
        if prev is None or prev.stamp is None or rec.stamp is None or prev.seq != rec.seq - 1 or prev.bs != rec.bs:
            return None
        if isinstance(rec.stamp, float):
            return prev.width, rec.stamp - prev.stamp
        if not (prev.stamp.query() and rec.stamp.query()):
            return None
        return prev.width, prev.stamp.elapsed_time(rec.stamp) / 1000.0


def _stamp() -> Any:
    if torch.cuda.is_available():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _host_copy(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A non-blocking copy of ``t`` into fresh pinned host memory, and an event after it (None on CPU)."""
    if t.device.type != "cuda":
        return t.clone(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


# -- the scheduler's side ----------------------------------------------------------------------------------------------
class Exporter:
    """DDTree's families in ``prometheus_client`` (SGLang's multiprocess registry when it runs with metrics), with
    the labels of SGLang's own scheduler collector."""

    def __init__(self, labels: dict[str, Any]):
        from prometheus_client import Counter, Histogram

        m = _metrics_mod()
        self.labels = {k: str(v) for k, v in labels.items()}
        names = list(self.labels)
        self.metrics: dict[str, Any] = {}
        for f in m.FAMILIES:
            if f.kind == "counter":
                self.metrics[f.name] = Counter(f.name, f.help, labelnames=names + list(f.labels))
            else:
                self.metrics[f.name] = Histogram(f.name, f.help, labelnames=names + list(f.labels),
                                                 buckets=m.ROUND_BUCKETS)
        self.ranks_seen = None  # the last cumulative rank counts exported

    def _child(self, family: Any, values: tuple[str, ...]) -> Any:
        return self.metrics[family.name].labels(**self.labels, **dict(zip(family.labels, values, strict=True)))

    def add_round(self, width: int, chain: bool, entries: list[list[int]]) -> None:
        for family, values, amount in _metrics_mod().round_increments(width, chain, entries):
            self._child(family, values).inc(amount)

    def add_ranks(self, snapshot: torch.Tensor, depth: int) -> None:
        """Export what the cumulative snapshot adds to the last one exported (snapshots only grow)."""
        m = _metrics_mod()
        now = snapshot.view(2, depth, RANKS).tolist()  # a host tensor: no device read
        last = self.ranks_seen
        for k, family in enumerate((m.RANK_OBSERVED, m.RANK_ACCEPTED)):
            for d in range(depth):
                for r in range(RANKS):
                    delta = now[k][d][r] - (last[k][d][r] if last is not None else 0)
                    if delta > 0:
                        self._child(family, (str(d + 1), str(r))).inc(delta)
        self.ranks_seen = now

    def observe(self, width: int, seconds: float) -> None:
        self._child(_metrics_mod().ROUND_SECONDS, (str(int(width)),)).observe(seconds)


_exporter: Optional[Exporter] = None


def exporter_for(processor: Any) -> Optional[Exporter]:
    """This process's exporter when its scheduler reports SGLang's metrics (``--enable-metrics``, and the reporting
    rank of its group, as SGLang's metrics reporter decides), else None. ``processor``: the scheduler's
    ``SchedulerBatchResultProcessor``, which holds SGLang's collector (None with metrics off) and reporter."""
    global _exporter
    collector = getattr(processor, "metrics_collector", None)
    reporter = getattr(processor, "metrics_reporter", None)
    if collector is None or not getattr(reporter, "current_scheduler_metrics_enabled", False):
        return None
    if _exporter is None:
        _exporter = Exporter(getattr(collector, "labels", None) or {})
    return _exporter


def _ddtree_round(processor: Any) -> Any:
    for name in ("model_worker", "draft_worker"):
        rnd = getattr(getattr(processor, name, None), "_ddtree", None)
        if rnd is not None:
            return rnd
    return None


def _meta_info_on() -> bool:
    from .bases import BASES
    from .config import base_version

    row = BASES.get(base_version())
    return row is None or row.meta_info


def on_resolved(processor: Any, result: Any, batch: Any, tokens: list) -> None:
    """After SGLang resolved a decode result's tokens on the host (see the module docstring)."""
    rnd = _ddtree_round(processor)
    accept_lens = getattr(result, "accept_lens", None)
    if rnd is None or accept_lens is None or not getattr(accept_lens, "is_cpu", False):
        return
    m = _metrics_mod()
    metrics: RoundMetrics = rnd.metrics
    reqs = list(batch.reqs)
    rec = metrics.take(result, len(reqs))
    if rec is None:  # a round launched without a record (never on the paths above): what the worker runs now
        rec = RoundRecord(seq=0, bs=len(reqs), budget=int(rnd.budget), width=0, chain=int(rnd.budget) == 0)
        rec.width = rec.budget + 1 if rec.budget else metrics.block
    accepted = [max(int(a) - 1, 0) for a in accept_lens.tolist()]
    carry = _meta_info_on()
    entries = []
    for i, req in enumerate(reqs):
        if i >= len(accepted) or req.is_retracted or req.finished():
            continue  # SGLang commits nothing for it this round
        budget = 0 if rec.chain else (rec.caps[i] if rec.caps is not None and i < len(rec.caps) else rec.budget)
        entry = m.round_entry(budget, accepted[i], metrics.depth if rec.chain else budget, rec.chain)
        entries.append(entry)
        if carry and i < len(tokens) and tokens[i]:
            _carry(req, m.ROUND_KEY, entry, len(tokens[i]))
    exp = exporter_for(processor) if metrics.export else None
    if exp is None:
        return
    exp.add_round(rec.width, rec.chain, entries)
    if rec.ranks is not None and (rec.ranks_ready is None or rec.ranks_ready.query()):
        exp.add_ranks(rec.ranks, metrics.depth)
    timed = metrics.round_seconds(rec)
    if timed is not None:
        exp.observe(*timed)


def _carry(req: Any, key: str, entry: list[int], n: int) -> None:
    """``entry`` on the first of the ``n`` tokens the round commits to ``req`` (None on the others), aligned with
    its output tokens, in SGLang's per-token ``customized_info``."""
    if req.customized_info is None:
        req.customized_info = {}
    values = req.customized_info.setdefault(key, [])  # grown in place (SGLang's streamer slices copies of it)
    done = len(req.output_ids)
    if len(values) > done:  # tokens of an earlier round that were not kept (a stop in its middle)
        del values[done:]
    values.extend([None] * (done - len(values)))
    values.append(entry)
    values.extend([None] * (n - 1))


def finish_meta_info(tokenizer_manager: Any, meta_info: dict) -> None:
    """A finished request's per-token round entries replaced by its summary (``metrics.META_KEYS``)."""
    m = _metrics_mod()
    entries = meta_info.pop(m.ROUND_KEY, None)
    if entries is None:
        return
    from .config import resolved

    block = getattr(resolved(getattr(tokenizer_manager, "server_args", None)), "speculative_dflash_block_size", None)
    meta_info.update(m.request_summary(entries, int(block) - 1 if block else None))
