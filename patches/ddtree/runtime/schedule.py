"""Batch-aware DDTree budgets: the schedule (which budget at which batch size) and the cost model that fits one.

Why: the verify forward is compute-bound once a batch is large, so every extra verified token costs round time
in proportion to the batch. A budget that pays at batch 1 (DDTree b64 needs 1.13x the chain's tokens per round
on the H200 at the Qwen3-8B shape) loses at batch 32 (2.8x needed). A schedule gives each batch size its own
budget; 0 means "run the plain DFlash chain for this round".

Text form: one budget ``N`` (every batch size), or ``T:B,T:B,...`` with batch-size thresholds ``T`` strictly
increasing from 1 and budgets ``B >= 0``: the budget of a batch of size ``bs`` is that of the entry with the largest
threshold ``<= bs``. ``1:64,8:32,16:16,32:0`` = b64 below 8, b32 from 8, b16 from 16, the chain from 32. The same schedule in the
shape SGLang's ``--speculative-adaptive`` uses, keyed by batch size: ``{"1": 64, "8": 32, "16": 16, "32": 0}``
(inline, or a path to a ``.json`` file holding it); it parses to the same ``Schedule``.

Hysteresis (:class:`Hysteresis`; the server's ``--speculative-ddtree-schedule-hold N``, default
:data:`DEFAULT_HOLD`): the schedule is keyed on the size of the decode batch only (prefill steps are not rounds), and a
round changes budget only once its batch size has wanted the new one for ``N`` decode rounds in a row, so a batch
size that oscillates across a threshold does not flip the width every round. It picks among the budgets the
schedule has, never another width; with CUDA graphs only among those captured at the round's padded size. The
widest budget's graphs, buffers and KV stay reserved whatever runs: they are sized at start-up (the SGLang glue's
``graph_widths`` says exactly what and why only a restart gives them back).

Pure Python (stdlib only, no torch): the serving glue (``ddtree_v2.config``), the online refit in the worker and
the product's ``tune`` command all share it. Vendored with the runtime; importable by path on its own
(register the module in ``sys.modules`` before executing it, as ``importlib`` loaders do: it holds a dataclass).
"""
from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

#: The verify width (budget + 1) is bounded by the tree mask and the CUDA-graph buffers (see ddtree_v2.config).
MAX_BUDGET = 1023


class ScheduleError(ValueError):
    """A schedule text or a cost-model input that cannot be used; the message says which entry and why."""


@dataclass(frozen=True)
class Schedule:
    """Budget per batch size: ``entries`` are ``(threshold, budget)`` pairs, thresholds strictly increasing from
    1, budgets in ``[0, MAX_BUDGET]`` (0 = the chain). Build it with :func:`parse_schedule` or
    :meth:`Schedule.of`; ``str()`` gives the canonical text, which parses back to an equal schedule."""

    entries: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        _check_entries(self.entries, "schedule")

    @classmethod
    def of(cls, budget_by_bs: Mapping[int, int] | int) -> "Schedule":
        """A schedule from one budget, or from ``{batch size: budget}`` (consecutive equal budgets merged; the
        smallest batch size's budget also covers the sizes below it, so the first threshold is 1)."""
        if isinstance(budget_by_bs, int):
            return cls(((1, int(budget_by_bs)),))
        if not budget_by_bs:
            raise ScheduleError("schedule: no batch sizes given")
        entries: list[tuple[int, int]] = []
        for bs in sorted(budget_by_bs):
            budget = int(budget_by_bs[bs])
            if not entries:
                entries.append((1, budget))
            elif entries[-1][1] != budget:
                entries.append((int(bs), budget))
        return cls(tuple(entries))

    def budget_for(self, bs: int) -> int:
        """The budget for a batch of ``bs`` requests (0 = the chain): the entry with the largest threshold <= bs.
        With CUDA graphs pass the padded (captured) batch size: the width must be the one its graph was
        captured at."""
        if int(bs) < 1:
            raise ValueError(f"batch size must be >= 1, got {bs}")
        budget = self.entries[0][1]
        for threshold, b in self.entries:
            if threshold > bs:
                break
            budget = b
        return budget

    @property
    def budgets(self) -> tuple[int, ...]:
        """The distinct budgets, ascending (0 included when some batch sizes run the chain)."""
        return tuple(sorted({b for _, b in self.entries}))

    @property
    def max_budget(self) -> int:
        """The largest budget: it sizes the KV reservation and the buffers."""
        return max(b for _, b in self.entries)

    @property
    def is_single(self) -> bool:
        """One budget for every batch size (the plain ``N`` form)."""
        return len(self.entries) == 1

    def __str__(self) -> str:
        if self.is_single and self.entries[0][1] > 0:  # an all-chain schedule stays "1:0": a bare 0 is refused
            return str(self.entries[0][1])
        return ",".join(f"{t}:{b}" for t, b in self.entries)


def _check_entries(entries: Sequence[tuple[int, int]], source: str) -> None:
    if not entries:
        raise ScheduleError(f"{source}: empty schedule (give one budget N, or thresholds like 1:64,8:32,32:0)")
    prev = 0
    for threshold, budget in entries:
        if entries[0][0] != 1:
            raise ScheduleError(f"{source}: the first threshold must be 1 (every batch size needs a budget), got "
                                f"{entries[0][0]}:{entries[0][1]}")
        if threshold <= prev:
            raise ScheduleError(f"{source}: batch-size thresholds must increase strictly, got {threshold} after "
                                f"{prev}")
        if budget < 0 or budget > MAX_BUDGET:
            raise ScheduleError(f"{source}: budget {budget} at threshold {threshold} is out of range: budgets are "
                                f"0 (the chain) to {MAX_BUDGET} (verify width budget + 1 <= {MAX_BUDGET + 1})")
        prev = threshold


def _int(text: str, what: str, source: str) -> int:
    text = text.strip()
    if not text or not (text.isdigit() or (text[0] in "+-" and text[1:].isdigit())):
        raise ScheduleError(f"{source}: {what} {text!r} is not an integer")
    return int(text)


def _parse_json_schedule(body: str, source: str) -> Schedule:
    """SGLang's adaptive shape, keyed by batch size: ``{"1": 64, "8": 16, "32": 0}``. Each key is the smallest batch
    size its budget applies to (the smallest key also covers the sizes below it), as in ``T:B`` text."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ScheduleError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected "
                            'an object of batch size -> budget like {"1": 64, "8": 16, "32": 0}') from None
    if not isinstance(doc, dict) or not doc:
        raise ScheduleError(f'{source}: expected a non-empty JSON object of batch size -> budget like {{"1": 64, '
                            f'"8": 16, "32": 0}}, got {type(doc).__name__}')
    by_bs: dict[int, int] = {}
    for key, value in doc.items():
        bs = _int(str(key), f"batch size {key!r}", source)
        if bs < 1:
            raise ScheduleError(f"{source}: batch size {key!r} must be >= 1")
        if isinstance(value, list):
            raise ScheduleError(f"{source}: batch size {key}: {value!r} is a list of draft depths (SGLang's EAGLE "
                                "--speculative-adaptive form); DDTree takes one budget per batch size, e.g. 64 "
                                "(0 = the plain DFlash chain)")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScheduleError(f"{source}: batch size {key}: budget {value!r} is not an integer")
        if value < 0 or value > MAX_BUDGET:
            raise ScheduleError(f"{source}: batch size {bs}: budget {value} is out of range: budgets are 0 (the "
                                f"chain) to {MAX_BUDGET}")
        by_bs[bs] = value
    return Schedule.of(by_bs)


def parse_schedule(text: str, *, source: str = "schedule") -> Schedule:
    """Parse ``N``, ``T:B,T:B,...`` (see the module docstring), SGLang's JSON shape ``{"1": 64, "8": 16, "32": 0}``
    inline, or a path to a ``.json`` file holding that object. ``source`` starts every error message (the serving
    glue passes the flag's name). A single ``N`` must be >= 1: a DDTree that never builds a tree is spelt ``1:0``."""
    if not isinstance(text, str):
        raise ScheduleError(f"{source}: expected a budget N or a schedule like 1:64,8:32,32:0, got {text!r}")
    body = text.strip()
    if not body:
        raise ScheduleError(f"{source}: empty value (give one budget N, or thresholds like 1:64,8:32,32:0)")
    if body.startswith("{"):
        return _parse_json_schedule(body, source)
    if body.endswith(".json"):
        try:
            with open(body, encoding="utf-8") as fh:
                content = fh.read()
        except OSError as exc:
            raise ScheduleError(f"{source}: cannot read the schedule file {body}: {exc.strerror}") from None
        return _parse_json_schedule(content, f"{source} ({body})")
    if ":" not in body and "," not in body:
        budget = _int(body, "budget", source)
        if budget < 1:
            raise ScheduleError(f"{source}: a single budget must be >= 1, got {budget} (0 = the chain for every "
                                "batch size: write 1:0, or drop the flag)")
        entries: tuple[tuple[int, int], ...] = ((1, budget),)
    else:
        parsed = []
        for i, item in enumerate(body.split(",")):
            if item.count(":") != 1:
                raise ScheduleError(f"{source}: entry {i + 1} {item.strip()!r} is not THRESHOLD:BUDGET (e.g. 8:32)")
            t, b = item.split(":")
            threshold = _int(t, f"threshold of entry {i + 1}", source)
            if threshold < 1:
                raise ScheduleError(f"{source}: threshold of entry {i + 1} must be a batch size >= 1, got "
                                    f"{threshold}")
            parsed.append((threshold, _int(b, f"budget of entry {i + 1}", source)))
        entries = tuple(parsed)
    _check_entries(entries, source)
    return Schedule(entries)


#: Decode rounds a new budget must be wanted in a row before a round runs it (``--speculative-ddtree-schedule-hold``).
DEFAULT_HOLD = 8


def check_hold(value: object, *, source: str = "hold") -> int:
    """A hold (decode rounds, an integer >= 0) from a flag's value (an int, or its text); a :class:`ScheduleError`
    starting with ``source`` (the flag's name) for anything else. 0 and 1 both mean no hold."""
    if isinstance(value, str):
        value = _int(value, "hold", source)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{source}: expected a number of decode rounds (an integer >= 0), got {value!r}")
    if value < 0:
        raise ScheduleError(f"{source}: must be >= 0 decode rounds (0 or 1 = no hold), got {value}")
    return value


class Hysteresis:
    """Which budget a decode round runs, given the budget its batch size wants: a change of budget waits until the
    new one has been wanted ``hold`` decode rounds in a row (that round runs it; the ``hold - 1`` before keep the old
    one). A wanted budget equal to the running one clears the count. ``hold`` 0 or 1: every round runs what it wants.

    Feed it decode rounds only (the batch size of the decode batch, never of a prefill / extend batch): a prefill
    step is no call, so it neither counts toward a change nor resets the count. The budget run is always one the
    caller wanted at some round (it never makes a width up); ``allowed``, where given, is what this round *can* run
    (with CUDA graphs: what was captured at its padded batch size): a running budget outside it gives way at once to
    the wanted one (a forced switch, counted in :attr:`forced`). Consequences: between two switches that are not
    forced there are at least ``hold`` rounds, so a batch size oscillating across a schedule threshold changes the
    width at most once every ``hold`` rounds; a steady change switches at its ``hold``-th round. Pure and
    deterministic (a function of the sequence of calls), so every tensor-parallel rank, fed the same batch sizes,
    picks the same width."""

    def __init__(self, hold: int = DEFAULT_HOLD):
        self.hold = check_hold(hold)
        self.current: Optional[int] = None  # the budget the last round ran (None before the first)
        self.pending: Optional[int] = None  # the budget wanted instead, and in how many rounds in a row
        self.count = 0
        self.rounds = 0
        self.switches = 0  # changes of budget (forced ones included)
        self.forced = 0
        self.held = 0  # rounds that ran another budget than the one they wanted

    def step(self, wanted: int, allowed: Optional[Iterable[int]] = None) -> int:
        """The budget this decode round runs (see the class docstring)."""
        wanted = int(wanted)
        runnable = None if allowed is None else {int(b) for b in allowed}
        if runnable is not None and wanted not in runnable:
            raise ValueError(f"the wanted budget {wanted} is not among this round's runnable budgets "
                             f"{sorted(runnable)}")
        self.rounds += 1
        if self.current is None:
            self.current = wanted
        elif wanted == self.current:
            self.pending, self.count = None, 0
        elif runnable is not None and self.current not in runnable:
            self._switch(wanted)
            self.forced += 1
        else:
            self.count = self.count + 1 if wanted == self.pending else 1
            self.pending = wanted
            if self.count >= self.hold:
                self._switch(wanted)
            else:
                self.held += 1
        return self.current

    def _switch(self, budget: int) -> None:
        self.current, self.pending, self.count = budget, None, 0
        self.switches += 1


#: Where a request carries its own DDTree settings: the ``ddtree`` key of SGLang's ``custom_params`` (the sampling
#: params of ``/generate``, or ``"custom_params"`` in an OpenAI request's extra body).
REQUEST_KEY = "ddtree"


def request_budget(custom_params: object, *, source: str = "custom_params") -> Optional[int]:
    """The most a request lets a round spend on it: ``{"ddtree": {"budget": N}}`` -> N (0 to :data:`MAX_BUDGET`),
    ``{"ddtree": {"speculative": false}}`` -> 0 (its tree cut to the root: one target token per round, as plain
    decoding), no ``ddtree`` key or ``{"speculative": true}`` -> None (the server's budget). A round still runs at
    the budget the schedule gives its batch: a request's budget only cuts its own tree (``prune_tree``). Anything
    else is a :class:`ScheduleError` naming the field (``source`` starts the message)."""
    if not isinstance(custom_params, Mapping) or custom_params.get(REQUEST_KEY) is None:
        return None
    where = f"{source}.{REQUEST_KEY}"
    doc = custom_params[REQUEST_KEY]
    if not isinstance(doc, Mapping):
        raise ScheduleError(f'{where}: expected an object like {{"budget": 16}} or {{"speculative": false}}, got '
                            f"{doc!r}")
    unknown = sorted(set(doc) - {"budget", "speculative"})
    if unknown:
        raise ScheduleError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} (known: 'budget', "
                            "'speculative')")
    spec = doc.get("speculative", True)
    if not isinstance(spec, bool):
        raise ScheduleError(f"{where}.speculative: expected true or false, got {spec!r}")
    budget = doc.get("budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                               or not 0 <= budget <= MAX_BUDGET):
        raise ScheduleError(f"{where}.budget: expected an integer from 0 (no draft tokens) to {MAX_BUDGET}, got "
                            f"{budget!r}")
    if not spec:
        if budget:
            raise ScheduleError(f"{where}: speculative false contradicts budget {budget} (give one of them)")
        return 0
    return budget


# -- the cost model -------------------------------------------------------------------------------------------------

def _check_profile(accept_profile: Sequence[Sequence[float]]) -> list[list[float]]:
    rows = []
    for d, row in enumerate(accept_profile):
        vals = [float(p) for p in row]
        if any(not (0.0 <= p <= 1.0) or math.isnan(p) for p in vals):
            raise ScheduleError(f"accept profile: depth {d} has a probability outside [0, 1]: {vals}")
        if sum(vals) > 1.0 + 1e-6:
            raise ScheduleError(f"accept profile: depth {d} sums to {sum(vals):.4f} > 1 (the ranks of one depth are "
                                "exclusive: at most one of them is the target's token)")
        rows.append(sorted(vals, reverse=True))
    return rows


def expected_tokens_per_round(budget: int, accept_profile: Sequence[Sequence[float]]) -> float:
    """Expected tokens one DDTree round commits with a best-first tree of ``budget`` nodes.

    ``accept_profile[d][r]``: the probability that the drafter's rank-``r`` candidate at depth ``d`` (0 = the
    first drafted position) is the target's token there, given that the path up to depth ``d`` was accepted.
    Assumptions (what makes this a model, not a measurement): acceptance at different depths is independent given
    the path, so a node's probability is the product of its ranks' probabilities along its path; the drafter's
    per-depth distributions do not depend on the parent (true of a DFlash block drafter: one forward drafts
    every position), so every node at depth ``d`` has the same rank list; and the drafter ranks the candidates in
    the order of their acceptance probability, so the best-first tree of ``budget`` nodes is the set of the
    ``budget`` most probable paths. A node is committed exactly when its whole path is the target's, so the
    expected count is 1 (the target's own token after the accepted path) + the sum of the tree nodes' path
    probabilities. The tree is at most ``len(accept_profile)`` deep (the drafter's block size - 1).

    Best-first over ranks sorted per depth: each node's successors are its first child and its next sibling, so
    the top ``budget`` paths come out of a heap in O(budget log budget)."""
    if int(budget) < 0:
        raise ScheduleError(f"budget must be >= 0, got {budget}")
    rows = _check_profile(accept_profile)
    depth = len(rows)
    if budget == 0 or depth == 0 or not rows[0]:
        return 1.0
    total = 1.0
    # heap items: (-prob, depth index, rank, parent prob)
    heap = [(-rows[0][0], 0, 0, 1.0)]
    taken = 0
    while heap and taken < budget:
        neg, d, r, parent = heapq.heappop(heap)
        prob = -neg
        total += prob
        taken += 1
        if r + 1 < len(rows[d]):
            heapq.heappush(heap, (-(parent * rows[d][r + 1]), d, r + 1, parent))
        if d + 1 < depth and rows[d + 1]:
            heapq.heappush(heap, (-(prob * rows[d + 1][0]), d + 1, 0, prob))
    return total


def chain_tokens_per_round(accept_profile: Sequence[Sequence[float]], block_size: Optional[int] = None) -> float:
    """Expected tokens a DFlash chain round commits: 1 + sum over depths of the product of the rank-0
    probabilities up to it (same independence assumption as :func:`expected_tokens_per_round`); the chain drafts
    ``block_size - 1`` positions (default: every depth of the profile)."""
    rows = _check_profile(accept_profile)
    depth = len(rows) if block_size is None else min(len(rows), max(int(block_size) - 1, 0))
    total, prob = 1.0, 1.0
    for d in range(depth):
        prob *= rows[d][0] if rows[d] else 0.0
        total += prob
    return total


def fit_schedule(accept_profile: Sequence[Sequence[float]], round_ms: Mapping[tuple[int, int], float],
                 chain_tokens_per_round: float, batch_sizes: Iterable[int], budgets: Iterable[int], *,
                 margin: float = 0.0, max_budget: Optional[Mapping[int, int]] = None) -> Schedule:
    """Per batch size, the budget that commits the most tokens per millisecond; 0 (the chain) wherever the chain
    is at least as good.

    ``round_ms[(budget, bs)]``: measured (or modelled) milliseconds of one round at that budget and batch size,
    with budget 0 = the chain round; every ``(b, bs)`` for ``b`` in ``budgets`` and ``(0, bs)`` is needed.
    ``chain_tokens_per_round``: what the chain commits per round (measured, or :func:`chain_tokens_per_round`).
    Tree rounds are valued by :func:`expected_tokens_per_round` (its assumptions apply). A budget must beat the
    chain's tokens/ms by the relative ``margin`` (e.g. 0.02 = 2 %) to be chosen, so noise in the cost table does
    not buy a slower round. Assumes tokens per round do not depend on the batch size (each request's acceptance
    is its own) and that the round cost of a batch does not depend on which requests are in it.

    ``max_budget[bs]`` (hybrid targets: every node carries its own recurrent state, so memory bounds the budget per
    batch size): budgets above it are not candidates at ``bs`` and need no cost there; a batch size missing from the
    mapping takes the limit of the next larger one listed (more requests never fit more nodes), or no limit."""
    sizes = sorted({int(bs) for bs in batch_sizes})
    cands = sorted({int(b) for b in budgets if int(b) > 0})
    if not sizes:
        raise ScheduleError("fit_schedule: no batch sizes")
    if chain_tokens_per_round <= 0:
        raise ScheduleError(f"fit_schedule: chain tokens per round must be > 0, got {chain_tokens_per_round}")
    tokens = {b: expected_tokens_per_round(b, accept_profile) for b in cands}
    chosen: dict[int, int] = {}
    for bs in sizes:
        limit = _limit_at(max_budget, bs)
        if (0, bs) not in round_ms:
            raise ScheduleError(f"fit_schedule: no chain round cost for batch size {bs} (round_ms[(0, {bs})])")
        best_b, best_rate = 0, float(chain_tokens_per_round) / float(round_ms[(0, bs)]) * (1.0 + float(margin))
        for b in cands:
            if limit is not None and b > limit:
                continue
            if (b, bs) not in round_ms:
                raise ScheduleError(f"fit_schedule: no round cost for budget {b} at batch size {bs}")
            rate = tokens[b] / float(round_ms[(b, bs)])
            if rate > best_rate:
                best_b, best_rate = b, rate
        chosen[bs] = best_b
    return Schedule.of(chosen)


def _limit_at(max_budget: Optional[Mapping[int, int]], bs: int) -> Optional[int]:
    """The largest budget that fits at ``bs`` requests: the entry of ``bs``, else of the next larger batch size
    listed (a smaller batch fits at least what a larger one does), else no limit."""
    if not max_budget:
        return None
    above = [k for k in max_budget if int(k) >= int(bs)]
    return int(max_budget[min(above)]) if above else None


# -- the built-in defaults (what `--speculative-ddtree-budget auto` uses) -------------------------------------------

#: Round milliseconds measured on one H200, SGLang 0.5.17 + this patch set, Qwen3-8B shape, CUDA graphs, 512-token
#: prompts (bench/results/sglang-0.5.17-h200.md): {budget: {batch size: ms}}, budget 0 = the V2 chain (block 16).
DEFAULT_ROUND_MS: dict[int, dict[int, float]] = {
    0: {1: 7.95, 8: 10.09, 32: 25.76},
    16: {1: 8.27, 8: 11.38, 32: 31.27},
    32: {1: 8.52, 8: 14.50, 32: 45.11},
    64: {1: 9.01, 8: 19.37, 32: 71.89},
}

#: The acceptance profile `auto` assumes (NOT a measurement of any drafter): per depth, rank 0 accepted with 0.86
#: given its parent (a b16 chain then commits ~6.5 tokens per round, inside the 5-7 published for b16 DFlash
#: drafters), ranks 1-3 with 0.06 / 0.025 / 0.012 (a tree over a chain gains ~+10-25 % tokens at b64, inside the
#: published +8-40 %). 15 depths = a block-16 drafter. `tune` replaces it with the host's measured profile.
DEFAULT_ACCEPT_PROFILE: tuple[tuple[float, ...], ...] = tuple((0.86, 0.06, 0.025, 0.012) for _ in range(15))


def interpolate_round_ms(table: Mapping[int, Mapping[int, float]], budget: int, bs: int) -> float:
    """Round ms at ``(budget, bs)`` from a sparse table ``{budget: {bs: ms}}``: piecewise linear in the batch size
    (extended linearly past the last two measured sizes, flat below the first) and, for a budget between two
    measured ones (tree budgets only, never the chain's 0), linear in the budget: the verify cost grows with the
    tokens verified."""
    def at(b: int) -> float:
        row = table[b]
        xs = sorted(row)
        if len(xs) == 1 or bs <= xs[0]:
            return float(row[xs[0]])
        for lo, hi in zip(xs, xs[1:], strict=False):
            if bs <= hi:
                return row[lo] + (row[hi] - row[lo]) * (bs - lo) / (hi - lo)
        lo, hi = xs[-2], xs[-1]
        return row[hi] + (row[hi] - row[lo]) * (bs - hi) / (hi - lo)

    if budget in table:
        return at(budget)
    trees = sorted(b for b in table if b > 0)
    if budget <= 0 or not trees:
        raise ScheduleError(f"round cost table has no entry for budget {budget}")
    if budget < trees[0]:
        lo_b, hi_b = (0, trees[0]) if 0 in table else (trees[0], trees[0])
    elif budget > trees[-1]:
        lo_b, hi_b = (trees[-2], trees[-1]) if len(trees) > 1 else (trees[-1], trees[-1])
    else:
        lo_b = max(b for b in trees if b < budget)
        hi_b = min(b for b in trees if b > budget)
    if lo_b == hi_b:
        return at(lo_b)
    lo, hi = at(lo_b), at(hi_b)
    return lo + (hi - lo) * (budget - lo_b) / (hi_b - lo_b)


def round_ms_grid(table: Mapping[int, Mapping[int, float]], budgets: Iterable[int],
                  batch_sizes: Iterable[int]) -> dict[tuple[int, int], float]:
    """``{(budget, bs): ms}`` for every budget (0 = the chain, always included) and batch size, from ``table``."""
    return {(b, bs): interpolate_round_ms(table, b, bs)
            for b in sorted({0, *(int(b) for b in budgets)}) for bs in sorted({int(s) for s in batch_sizes})}


#: The budgets `auto` chooses among (the widths the cost table measured).
DEFAULT_BUDGETS = (16, 32, 64)

# -- hybrid GatedDeltaNet targets ------------------------------------------------------------------------------------

#: Round milliseconds of a hybrid target with the chunk-form GatedDeltaNet verify (the default; records per node,
#: no state per node), measured on one H200, SGLang 0.5.17 + this patch set, the Qwen3.6-27B shape (48 GatedDeltaNet +
#: 16 gated-attention layers, random weights) with the z-lab Qwen3.6-27B-DFlash drafter shape (block 16), CUDA graphs,
#: 16 max running requests, 8 reps per cell (bench/results/hybrid-0.5.17-h200-q36c.md: the median of the differenced
#: round times; `bench/e2e/hybrid_v2.sh TAG q36c` re-measures it): {budget: {batch size: ms}}, budget 0 = the V2 chain.
#: Only the budgets measured in chunk form are listed: `auto` never extrapolates a budget it has no row for.
HYBRID_ROUND_MS: dict[int, dict[int, float]] = {
    0: {1: 20.68, 8: 31.38, 16: 45.56},
    16: {1: 21.74, 8: 35.02, 16: 53.25},
    64: {1: 26.37, 8: 78.81, 16: 153.08},
}
#: The budgets `auto` chooses among on a hybrid target.
HYBRID_BUDGETS = (16, 64)
#: The largest budget that fits at each batch size (the start-up memory check of that run: 586 nodes at 16 running
#: requests, 5.07 MiB per node and request; fewer requests fit at least as many). The runtime caps it further
#: (ddtree_v2.hybrid's MAX_HYBRID_BUDGET) and checks the real pool at start-up.
HYBRID_MAX_BUDGET = {16: 586}

#: The recurrent form's table (a state per node, ``DDTREE_GDN_VERIFY=recurrent``; issue #24's first measurement,
#: bench/results/hybrid-0.5.17-h200.md) and the GatedDeltaNet verify's measured shares of those rounds at batch 1 (the
#: profiler's kernel time): 11 % of the chain's round (16 verified tokens per request), 47 % of the b128 round (129
#: nodes). They give :func:`gdn_verify_ms_per_node`'s default, the model of a host whose hybrid rounds were not measured.
HYBRID_ROUND_MS_RECURRENT: dict[int, dict[int, float]] = {
    0: {1: 20.89, 8: 31.59, 16: 46.44},
    16: {1: 20.89 * 1.03, 8: 31.59 * 1.09, 16: 46.44 * 1.18},
    32: {1: 20.89 * 1.16, 8: 31.59 * 1.61},
    64: {1: 20.89 * 1.41},
    128: {1: 20.89 * 1.96},
}
HYBRID_GDN_SHARE = {0: 0.11, 128: 0.47}


def gdn_verify_ms_per_node(table: Mapping[int, Mapping[int, float]] = HYBRID_ROUND_MS_RECURRENT,
                           shares: Mapping[int, float] = HYBRID_GDN_SHARE, *, block_size: int = 16) -> float:
    """The GatedDeltaNet verify's cost per verified node (ms, one request), from two measured shares at batch 1:
    the slope between the chain's GDN time (block-size tokens) and the largest measured budget's (budget + 1
    nodes). With the built-in figures: (0.47 x 40.94 - 0.11 x 20.89) / (129 - 16) = 0.150 ms per node, i.e. a
    node of the tree costs the 27B shape's 48 GDN layers about 0.15 ms that a node of a dense target does not."""
    (b_lo, s_lo), (b_hi, s_hi) = sorted(shares.items())[0], sorted(shares.items())[-1]
    n_lo = int(block_size) if b_lo == 0 else b_lo + 1
    n_hi = int(block_size) if b_hi == 0 else b_hi + 1
    if n_hi == n_lo:
        raise ScheduleError("gdn_verify_ms_per_node: the shares must be of two different widths")
    return (s_hi * table[b_hi][1] - s_lo * table[b_lo][1]) / (n_hi - n_lo)


def hybrid_round_ms(dense: Mapping[int, Mapping[int, float]], budget: int, bs: int, *,
                    gdn_ms_per_node: float, block_size: int = 16) -> float:
    """A hybrid target's round from a dense round-cost table (the attention / MLP / drafter part) plus the GDN
    verify: ``gdn_ms_per_node`` per verified node and request (budget + 1 nodes, or the chain's block), linear in
    the batch size. A model for a host whose hybrid rounds were not measured (``tune`` measures them instead)."""
    nodes = int(budget) + 1 if int(budget) > 0 else int(block_size)
    return interpolate_round_ms(dense, budget, bs) + float(gdn_ms_per_node) * nodes * int(bs)


def default_schedule(batch_sizes: Iterable[int], *, block_size: int = 16,
                     accept_profile: Optional[Sequence[Sequence[float]]] = None,
                     round_ms: Optional[Mapping[int, Mapping[int, float]]] = None,
                     budgets: Optional[Iterable[int]] = None, margin: float = 0.02, hybrid: bool = False,
                     max_budget: Optional[Mapping[int, int]] = None) -> Schedule:
    """What ``--speculative-ddtree-budget auto`` runs: :func:`fit_schedule` over ``budgets`` at ``batch_sizes``
    (the captured CUDA-graph sizes, or 1..max running requests eagerly) with the built-in H200 cost table
    (:data:`DEFAULT_ROUND_MS`, interpolated), the built-in profile (:data:`DEFAULT_ACCEPT_PROFILE`, cut to
    ``block_size - 1`` depths), the chain valued by :func:`chain_tokens_per_round`, and a 2 % margin. With the
    built-in tables this is b64 at batch 1 and the chain from a few requests on.

    ``hybrid``: a GatedDeltaNet hybrid target: the hybrid table (:data:`HYBRID_ROUND_MS`, whose GDN verify grows
    with every node: :func:`gdn_verify_ms_per_node`) and budgets :data:`HYBRID_BUDGETS`, each only where its
    per-node states fit (``max_budget``, default :data:`HYBRID_MAX_BUDGET`) and up to the largest batch size its
    row measured (a budget is never extrapolated to batches it was not run at). With the built-in tables this is the
    chain at every batch size: under the assumed profile b16 commits +1 % and b64 +13 % more tokens per round than
    the chain, and their rounds cost 1.05x and 1.28x at batch 1 (chunk form); a better drafter (a measured profile,
    ``tune``) or a cheaper round changes that."""
    profile = list(accept_profile if accept_profile is not None else DEFAULT_ACCEPT_PROFILE)
    profile = profile[: max(int(block_size) - 1, 0)]
    sizes = sorted({int(bs) for bs in batch_sizes}) or [1]
    table = round_ms if round_ms is not None else (HYBRID_ROUND_MS if hybrid else DEFAULT_ROUND_MS)
    cands = tuple(budgets if budgets is not None else (HYBRID_BUDGETS if hybrid else DEFAULT_BUDGETS))
    limits = dict(max_budget) if max_budget is not None else (dict(HYBRID_MAX_BUDGET) if hybrid else None)
    if hybrid:  # a budget runs only up to the batch sizes its row measured
        measured = {b: max(table[b]) for b in cands if b in table}
        cands = tuple(measured)
        limits = {bs: min([lim for lim in [_limit_at(limits, bs)] if lim is not None]
                          + [max([0] + [b for b in cands if measured[b] >= bs])]) for bs in sizes}
        grid = {(b, bs): interpolate_round_ms(table, b, bs) for b in (0, *cands) for bs in sizes
                if b == 0 or b <= limits[bs]}
    else:
        grid = round_ms_grid(table, cands, sizes)
    return fit_schedule(profile, grid, chain_tokens_per_round(profile, block_size), sizes, cands, margin=margin,
                        max_budget=limits)
