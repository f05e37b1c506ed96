"""The speculative-decoding part of a host's server flags (``server.ddtree_flags``), as ``bench`` and ``tune`` vary it.

One place knows how the flags spell each decoding mode, for SGLang with our patch set and for the reference engine
alike: DDTree is ``--speculative-algorithm DFLASH --speculative-ddtree-budget N|SCHEDULE``; the stock DFlash chain is
the same flags without the budget; plain decoding is the server command without ``ddtree_flags`` at all (the host
file's ``{ddtree_flags}`` placeholder left empty, as for a baseline).
"""
from __future__ import annotations

import shlex

BUDGET_FLAGS = ("--speculative-ddtree-budget", "--ddtree-budget")
#: DDTree's other flags, which mean nothing without the budget (SGLang with our patch set refuses each of them alone,
#: naming it): the chain's flags drop them. Those that take a value, then the switches.
DDTREE_VALUE_FLAGS = ("--speculative-ddtree-schedule-hold", "--speculative-ddtree-schedule")
DDTREE_SWITCHES = ("--speculative-ddtree-adapt", "--speculative-ddtree-allow-unproven")
ALGORITHM_FLAG = "--speculative-algorithm"
#: SGLang's switch for ``/metrics`` (its own families and DDTree's); the reference engine takes it too.
METRICS_FLAG = "--enable-metrics"


def _find(tokens: list[str], names: tuple[str, ...]) -> tuple[int, int, str] | None:
    """(start, end, value) of the first ``--name value`` / ``--name=value`` in ``tokens``."""
    for i, tok in enumerate(tokens):
        for name in names:
            if tok == name and i + 1 < len(tokens):
                return i, i + 2, tokens[i + 1]
            if tok.startswith(name + "="):
                return i, i + 1, tok[len(name) + 1:]
    return None


def budget_of(flags: str) -> str | None:
    """The DDTree budget (or schedule) text the flags give, or None (not DDTree)."""
    hit = _find(shlex.split(flags or ""), BUDGET_FLAGS)
    return hit[2] if hit else None


def algorithm_of(flags: str) -> str | None:
    hit = _find(shlex.split(flags or ""), (ALGORITHM_FLAG,))
    return hit[2].upper() if hit else None


def with_budget(flags: str, budget: str) -> str:
    """The flags with the DDTree budget set to ``budget`` (replaced where it is, else appended)."""
    tokens = shlex.split(flags or "")
    hit = _find(tokens, BUDGET_FLAGS)
    if hit:
        start, end, _ = hit
        tokens[start:end] = [tokens[start].split("=", 1)[0], str(budget)]
    else:
        tokens += [BUDGET_FLAGS[0], str(budget)]
    return shlex.join(tokens)


def chain_flags(flags: str) -> str:
    """The stock DFlash chain: the same flags without the DDTree budget and DDTree's other flags (each refused
    without the budget), the reference engine's own ``DDTREE`` algorithm name becoming ``DFLASH``."""
    tokens = shlex.split(flags or "")
    for names in (BUDGET_FLAGS, *((name,) for name in DDTREE_VALUE_FLAGS)):
        hit = _find(tokens, names)
        while hit:
            del tokens[hit[0]:hit[1]]
            hit = _find(tokens, names)
    tokens = [t for t in tokens if t not in DDTREE_SWITCHES]
    alg = _find(tokens, (ALGORITHM_FLAG,))
    if alg and alg[2].upper() == "DDTREE":
        tokens[alg[0]:alg[1]] = [ALGORITHM_FLAG, "DFLASH"]
    return shlex.join(tokens)


def is_ddtree(flags: str) -> bool:
    """Whether the flags run DDTree (a budget with the DFLASH algorithm, or the reference engine's DDTREE)."""
    alg = algorithm_of(flags)
    return alg == "DDTREE" or (alg == "DFLASH" and budget_of(flags) is not None)


def with_metrics(flags: str) -> str:
    """The flags with ``/metrics`` on (``--enable-metrics`` appended unless they have it): what ``bench`` and ``tune``
    measure with, so DDTree's acceptance counters can be read from the server."""
    tokens = shlex.split(flags or "")
    return shlex.join(tokens if METRICS_FLAG in tokens else tokens + [METRICS_FLAG])
