"""DDTree's acceptance metrics, defined once for the SGLang patch set, the reference engine and the control side.

The common definitions: a *draft* is one request's verify in one round; ``mean acceptance length = 1 + accepted /
drafts``; the acceptance at depth ``d`` is ``accepted_at_d / drafts`` (``accepted_at_d``: drafts whose accepted path
reached depth ``d``). A *round* is one decode step of the whole batch, at one verify width.

**Per request** (SGLang's ``meta_info``, beside its own ``spec_accept_length``, ``spec_verify_ct``, ...). During a
round the serving side records one entry per request, ``[budget, accepted, drafted, chain]`` (:func:`round_entry`):
the budget that request's tree was given (0 in a chain round, and for a request that asked for none), the draft
tokens it accepted (the bonus token not counted), the draft tokens it had verified (its tree's nodes, or the
chain's ``block - 1``), and 1 for a chain round. :func:`request_summary` turns a request's entries into
:data:`META_KEYS`.

**Server-wide** (Prometheus text on ``/metrics``, added to SGLang's own families; every name starts with
:data:`PREFIX`, and none of SGLang's does): :data:`FAMILIES`. :func:`round_increments` says what one round adds to
each, so the patch set (through ``prometheus_client``) and the reference engine (through :class:`Totals` and
:func:`render`) count alike; :func:`parse` and :func:`acceptance` read them back on the control side.

Stdlib only, no relative imports: vendored with the runtime, and loadable by path on its own (as ``tune`` loads it).
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

PREFIX = "sglang:ddtree_"


@dataclass(frozen=True)
class Family:
    """One Prometheus metric family: ``name`` as registered (a counter's samples add ``_total``)."""

    name: str
    kind: str  # "counter" | "histogram"
    help: str
    labels: tuple[str, ...] = ()

    @property
    def sample(self) -> str:
        """The sample name a scrape shows (a counter's ``_total``; a histogram's ``_count``)."""
        return self.name + ("_total" if self.kind == "counter" else "_count")


DRAFTS = Family(PREFIX + "spec_decode_num_drafts", "counter",
                "DDTree drafts verified: one per request per round (the steps of mean acceptance length = 1 + "
                "accepted / drafts)")
DRAFT_TOKENS = Family(PREFIX + "spec_decode_num_draft_tokens", "counter",
                      "Draft tokens verified: the nodes of each request's tree (its budget), or the chain's "
                      "block - 1")
ACCEPTED_TOKENS = Family(PREFIX + "spec_decode_num_accepted_tokens", "counter",
                         "Draft tokens accepted (the bonus token of each draft not counted)")
ACCEPTED_PER_DEPTH = Family(PREFIX + "spec_decode_num_accepted_tokens_per_depth", "counter",
                            "Drafts whose accepted path reached draft depth d (acceptance at d = this / drafts)",
                            ("depth",))
ROUNDS = Family(PREFIX + "rounds", "counter",
                "Decode rounds (one per batch step) by verify width: the tokens per request the target verified "
                "(budget + 1 for a tree, the block size for the chain)", ("verify_width",))
CHAIN_ROUNDS = Family(PREFIX + "chain_rounds", "counter",
                      "Decode rounds that ran the DFlash chain (the schedule's budget 0 at that batch size)")
RANK_OBSERVED = Family(PREFIX + "draft_rank_observed", "counter",
                       "Tree nodes of sibling rank r (0 = the drafter's best candidate) at depth d whose parent was "
                       "accepted: the target's token there was known", ("depth", "rank"))
RANK_ACCEPTED = Family(PREFIX + "draft_rank_accepted", "counter",
                       "Of those, the nodes whose token was the target's (the cost model's acceptance profile at "
                       "(d, r) = accepted / observed)", ("depth", "rank"))
ROUND_SECONDS = Family(PREFIX + "round_seconds", "histogram",
                       "Time from one decode round's start to the next's while the batch stays the same (the "
                       "draft, tree, verify and commit of a round), by the earlier round's verify width",
                       ("verify_width",))
FAMILIES = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_DEPTH, ROUNDS, CHAIN_ROUNDS, RANK_OBSERVED,
            RANK_ACCEPTED, ROUND_SECONDS)
#: Upper bounds (seconds) of the round-time histogram's buckets.
ROUND_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                 0.25, 0.5, 1.0, 2.5)

# -- per request ---------------------------------------------------------------------------------------------------
#: The per-token key the patch set carries a request's round entries under (SGLang's ``customized_info``: the entry
#: of a round sits on the first token that round committed, None elsewhere) until :func:`request_summary` replaces
#: it in the finished request's ``meta_info``.
ROUND_KEY = "ddtree_round"
#: What :func:`request_summary` gives, in this order.
META_KEYS = ("ddtree_verify_ct", "ddtree_accept_length", "ddtree_accepted_tokens", "ddtree_draft_tokens",
             "ddtree_accepted_per_depth", "ddtree_budget", "ddtree_chain_rounds")


def round_entry(budget: int, accepted: int, drafted: int, chain: bool) -> list[int]:
    """One request's record of one round (see the module docstring)."""
    return [int(budget), int(accepted), int(drafted), 1 if chain else 0]


def request_summary(entries: Iterable[Any], depths: Optional[int] = None) -> dict[str, Any]:
    """A request's :data:`META_KEYS` from its round entries (None items, the tokens between round starts, are
    skipped): the rounds, ``1 + accepted / rounds``, the accepted and drafted totals, per depth 1..``depths`` the
    rounds whose accepted path reached it (``depths`` None: up to the deepest reached), the budget per round
    (``{"min", "median", "max"}``, a chain round counting as 0) and the chain rounds. Empty without entries."""
    rows = [e for e in entries if isinstance(e, (list, tuple)) and len(e) >= 4]
    if not rows:
        return {}
    accepted = [int(e[1]) for e in rows]
    top = max(accepted) if depths is None else int(depths)
    budgets = [int(e[0]) for e in rows]
    return {
        "ddtree_verify_ct": len(rows),
        "ddtree_accept_length": round(1.0 + sum(accepted) / len(rows), 4),
        "ddtree_accepted_tokens": sum(accepted),
        "ddtree_draft_tokens": sum(int(e[2]) for e in rows),
        "ddtree_accepted_per_depth": [sum(1 for a in accepted if a >= d) for d in range(1, top + 1)],
        "ddtree_budget": {"min": min(budgets), "median": statistics.median(budgets), "max": max(budgets)},
        "ddtree_chain_rounds": sum(int(e[3]) for e in rows),
    }


# -- server-wide ---------------------------------------------------------------------------------------------------
def round_increments(width: int, chain: bool, entries: Sequence[Sequence[int]]
                     ) -> list[tuple[Family, tuple[str, ...], float]]:
    """What one round adds to the counters: ``(family, label values, amount)``, zero amounts left out. ``width``:
    the round's verify width; ``entries``: the round entries of its requests."""
    out: list[tuple[Family, tuple[str, ...], float]] = [(ROUNDS, (str(int(width)),), 1)]
    if chain:
        out.append((CHAIN_ROUNDS, (), 1))
    if entries:
        out += [(DRAFTS, (), len(entries)), (DRAFT_TOKENS, (), sum(int(e[2]) for e in entries)),
                (ACCEPTED_TOKENS, (), sum(int(e[1]) for e in entries))]
        deepest = max(int(e[1]) for e in entries)
        out += [(ACCEPTED_PER_DEPTH, (str(d),), sum(1 for e in entries if int(e[1]) >= d))
                for d in range(1, deepest + 1)]
    return [(f, labels, v) for f, labels, v in out if v]


class Totals:
    """The server-wide counters in memory (the reference engine's; the patch set keeps them in ``prometheus_client``):
    :meth:`add_round` per round, :meth:`set_ranks` with the cumulative per-(depth, rank) counts, :meth:`samples` /
    :func:`render` for a scrape."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, tuple[str, ...]], float] = {}
        self.hist: dict[str, list[float]] = {}  # width -> [bucket counts..., +Inf count, sum]

    def add(self, family: Family, labels: tuple[str, ...], amount: float) -> None:
        key = (family.name, labels)
        self.counts[key] = self.counts.get(key, 0) + amount

    def add_round(self, width: int, chain: bool, entries: Sequence[Sequence[int]]) -> None:
        for family, labels, amount in round_increments(width, chain, entries):
            self.add(family, labels, amount)

    def observe_round(self, width: int, seconds: float) -> None:
        row = self.hist.setdefault(str(int(width)), [0.0] * (len(ROUND_BUCKETS) + 2))
        for i, bound in enumerate(ROUND_BUCKETS):
            row[i] += seconds <= bound
        row[len(ROUND_BUCKETS)] += 1
        row[-1] += seconds

    def set_ranks(self, observed: Sequence[Sequence[int]], accepted: Sequence[Sequence[int]]) -> None:
        """The cumulative per-(depth, rank) counts ([depth][rank], depth 1 first), replacing the previous ones."""
        for family, rows in ((RANK_OBSERVED, observed), (RANK_ACCEPTED, accepted)):
            for d, row in enumerate(rows, 1):
                for r, v in enumerate(row):
                    self.counts[(family.name, (str(d), str(r)))] = v

    def samples(self) -> list[tuple[Family, str, dict[str, str], float]]:
        """Every sample: ``(family, sample name, labels, value)``, families in :data:`FAMILIES` order."""
        out = []
        for f in FAMILIES:
            if f.kind == "counter":
                for (name, labels), v in sorted(self.counts.items(), key=lambda kv: [_num(x) for x in kv[0][1]]):
                    if name == f.name:
                        out.append((f, f.sample, dict(zip(f.labels, labels, strict=True)), v))
                continue
            for width, row in sorted(self.hist.items(), key=lambda kv: int(kv[0])):
                for i, bound in enumerate(ROUND_BUCKETS):
                    out.append((f, f.name + "_bucket", {"verify_width": width, "le": repr(float(bound))}, row[i]))
                out.append((f, f.name + "_bucket", {"verify_width": width, "le": "+Inf"}, row[len(ROUND_BUCKETS)]))
                out.append((f, f.name + "_count", {"verify_width": width}, row[len(ROUND_BUCKETS)]))
                out.append((f, f.name + "_sum", {"verify_width": width}, row[-1]))
        return out


def _num(text: str) -> Any:
    return (0, int(text)) if text.isdigit() else (1, text)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Sequence[tuple[Family, str, Mapping[str, str], float]],
           extra_labels: Optional[Mapping[str, str]] = None) -> str:
    """Prometheus text exposition (format 0.0.4) of :meth:`Totals.samples`: ``# HELP`` / ``# TYPE`` per family,
    ``extra_labels`` on every sample (first)."""
    lines: list[str] = []
    seen: set[str] = set()
    for family, name, labels, value in samples:
        if family.name not in seen:
            seen.add(family.name)
            shown = family.sample if family.kind == "counter" else family.name
            lines += [f"# HELP {shown} {family.help}", f"# TYPE {shown} {family.kind}"]
        every = {**(extra_labels or {}), **labels}
        body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in every.items())
        lines.append(f"{name}{{{body}}} {float(value)!r}" if body else f"{name} {float(value)!r}")
    return "\n".join(lines) + ("\n" if lines else "")


# -- reading a scrape (the control side) -----------------------------------------------------------------------------
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse(text: str, prefix: str = PREFIX) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of a Prometheus text scrape whose name starts with ``prefix``: sample name -> [(labels, value)].
    Comments, other families and lines that are not samples are skipped; a value that is not a number is skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith(prefix):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(m.group(2) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _total(samples: Mapping[str, list], family: Family, by: Optional[str] = None) -> Any:
    """A family's samples summed over every label but ``by`` (SGLang's own labels: model, ranks, ...)."""
    rows = samples.get(family.sample, [])
    if by is None:
        return sum(v for _, v in rows) if rows else None
    out: dict[str, float] = {}
    for labels, v in rows:
        if by in labels:
            out[labels[by]] = out.get(labels[by], 0.0) + v
    return out


def _matrices(samples: Mapping[str, list], *families: Family) -> list[list[list[float]]]:
    """Each family's [depth][rank] counts (depth 1 first), all of one shape: the deepest depth and the most ranks
    any of them counted (a counter SGLang never incremented is absent from a scrape: 0)."""
    cells: list[dict[tuple[int, int], float]] = []
    for family in families:
        c: dict[tuple[int, int], float] = {}
        for labels, v in samples.get(family.sample, []):
            try:
                key = (int(labels["depth"]), int(labels["rank"]))
            except (KeyError, ValueError):
                continue
            c[key] = c.get(key, 0.0) + v
        cells.append(c)
    keys = [k for c in cells for k in c]
    if not keys:
        return [[] for _ in families]
    depths, ranks = max(d for d, _ in keys), max(r for _, r in keys) + 1
    return [[[c.get((d, r), 0.0) for r in range(ranks)] for d in range(1, depths + 1)] for c in cells]


def acceptance(text_or_samples: Any) -> Optional[dict[str, Any]]:
    """DDTree's counters from a scrape (text, or :func:`parse`'s result), summed over SGLang's labels, or None
    when the scrape has none of them (no DDTree, or a server without them): ``drafts``, ``draft_tokens``,
    ``accepted_tokens``, ``accepted_per_depth`` [depth 1..], ``rounds`` {width: n}, ``chain_rounds``,
    ``rank_observed`` / ``rank_accepted`` [depth][rank], ``round_seconds`` {width: {"sum", "count"}}."""
    samples = parse(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    if not any(f.sample in samples for f in FAMILIES):
        return None
    per_depth = _total(samples, ACCEPTED_PER_DEPTH, "depth")
    deepest = max((int(d) for d in per_depth if d.isdigit()), default=0)
    observed, accepted = _matrices(samples, RANK_OBSERVED, RANK_ACCEPTED)
    secs = {w: {"sum": s, "count": _total(samples, ROUND_SECONDS, "verify_width").get(w, 0.0)}
            for w, s in _sum_by(samples, ROUND_SECONDS.name + "_sum", "verify_width").items()}
    return {"drafts": _total(samples, DRAFTS) or 0.0, "draft_tokens": _total(samples, DRAFT_TOKENS) or 0.0,
            "accepted_tokens": _total(samples, ACCEPTED_TOKENS) or 0.0,
            "accepted_per_depth": [per_depth.get(str(d), 0.0) for d in range(1, deepest + 1)],
            "rounds": _total(samples, ROUNDS, "verify_width"), "chain_rounds": _total(samples, CHAIN_ROUNDS) or 0.0,
            "rank_observed": observed, "rank_accepted": accepted, "round_seconds": secs}


def _sum_by(samples: Mapping[str, list], name: str, by: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in samples.get(name, []):
        if by in labels:
            out[labels[by]] = out.get(labels[by], 0.0) + v
    return out


def difference(after: Optional[Mapping[str, Any]], before: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """``after - before`` of two :func:`acceptance` results (the counters a workload added); ``after`` as it is
    when ``before`` is None (a server restarted in between starts from zero)."""
    if after is None or before is None:
        return None if after is None else dict(after)

    def sub(a: Any, b: Any) -> Any:
        if isinstance(a, Mapping):
            return {k: sub(v, (b or {}).get(k, 0.0) if isinstance(b, Mapping) else 0.0) for k, v in a.items()}
        if isinstance(a, list):
            b = b if isinstance(b, list) else []
            return [sub(x, b[i] if i < len(b) else (0.0 if not isinstance(x, list) else [])) for i, x in enumerate(a)]
        return a - (b or 0.0)

    return sub(dict(after), dict(before))


def accept_profile(acc: Mapping[str, Any], depths: Optional[int] = None) -> list[list[float]]:
    """The cost model's acceptance profile from :func:`acceptance`: per depth and rank, accepted / observed (0
    where a rank was never in a tree), depths 1..``depths`` (default: as many as counted)."""
    obs, hit = acc.get("rank_observed") or [], acc.get("rank_accepted") or []
    n = len(obs) if depths is None else min(int(depths), len(obs))
    return [[round(hit[d][r] / obs[d][r], 4) if obs[d][r] and d < len(hit) and r < len(hit[d]) else 0.0
             for r in range(len(obs[d]))] for d in range(n)]


def accept_by_depth(acc: Mapping[str, Any]) -> list[float]:
    """Per depth 1..: the share of drafts whose accepted path reached it (``accepted_at_d / drafts``)."""
    drafts = float(acc.get("drafts") or 0.0)
    return [round(x / drafts, 4) if drafts else 0.0 for x in acc.get("accepted_per_depth") or []]


def mean_round_ms(acc: Mapping[str, Any]) -> dict[int, float]:
    """Per verify width, the mean of the round-time histogram, in milliseconds (widths with timed rounds only)."""
    return {int(w): round(1000.0 * s["sum"] / s["count"], 3) for w, s in (acc.get("round_seconds") or {}).items()
            if s.get("count") and not math.isnan(s["sum"])}
