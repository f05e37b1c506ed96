"""What a host's running server does right now, for ``probe`` and ``releases``: the mean acceptance length and the
decode speed from DDTree's server-wide counters (the ``sglang:ddtree_*`` families on ``/metrics``, defined in the
runtime's ``metrics.py`` and read with it, as ``bench`` and ``tune`` read them).

``/metrics`` is read twice, ``window`` seconds apart, on the host itself (``remote/probe.py`` ``metrics_window``,
through the host's transport: the server's port is never reached from outside), and the interval is timed there.
Over that window: ``mean_acceptance_length = 1 + accepted draft tokens / drafts`` (a draft is one request's verify in
one round: the runtime's definition) and ``decode_tokens_per_s = (drafts + accepted draft tokens) / window_s``
(every draft commits its accepted tokens and the target's own token after them; the first token of each request,
which prefill gives, is not counted, and a request that reaches its length limit mid-round commits fewer). A
window in which the server decoded nothing is "idle" (no speed is made up for it); the acceptance length since
the server started is given beside it. A server that is down, serves no ``/metrics`` or none of DDTree's families
is ``unavailable`` with the reason; never a failure of the command that asked.
"""
from __future__ import annotations

from typing import Any

from .errors import OperationFailed, TransportError
from .inventory import Host
from .runtime_files import metrics_module
from .server import base_url, server_kind
from .transport import HostConnection

#: Seconds between the two reads of ``/metrics`` (``--live-window``, ``$DDTREE_LIVE_WINDOW``): a GPU server runs tens
#: of rounds a second, and ``releases`` stays a quick read.
DEFAULT_WINDOW = 1.0

#: What each figure of :func:`read_live` is (also in its ``--json``).
DEFINITIONS = {
    "mean_acceptance_length": "1 + accepted draft tokens / drafts over the window (a draft: one request's verify "
                              "in one round), from sglang:ddtree_spec_decode_num_accepted_tokens and "
                              "sglang:ddtree_spec_decode_num_drafts; null when the server decoded nothing in it",
    "mean_acceptance_length_since_start": "the same from the counters' totals (since the server started)",
    "decode_tokens_per_s": "tokens DDTree's verify rounds committed per second over the window: (drafts + accepted "
                           "draft tokens) / window_s; prefill's first token of each request not counted; null when "
                           "the server decoded nothing in it (status idle)",
    "window_s": "seconds between the two reads of /metrics, timed on the host",
}


def _accept_length(drafts: float, accepted: float) -> float | None:
    return round(1.0 + accepted / drafts, 3) if drafts > 0 else None


def unavailable(reason: str) -> dict[str, Any]:
    return {"status": "unavailable", "reason": reason, "mean_acceptance_length": None,
            "mean_acceptance_length_since_start": None, "decode_tokens_per_s": None}


def summarize(reply: dict[str, Any]) -> dict[str, Any]:
    """The live figures from a ``metrics_window`` reply (``{"before", "after", "seconds"}`` or ``{"error"}``)."""
    if reply.get("error"):
        return unavailable(str(reply["error"]))
    m = metrics_module()
    before, after = m.acceptance(reply.get("before") or ""), m.acceptance(reply.get("after") or "")
    if before is None or after is None:
        return unavailable("/metrics has none of DDTree's counters")
    seconds = round(float(reply["seconds"]), 4)  # the figure given as window_s, and the one divided by
    drafts, accepted = after["drafts"] - before["drafts"], after["accepted_tokens"] - before["accepted_tokens"]
    total = {"drafts": int(after["drafts"]), "accepted_tokens": int(after["accepted_tokens"])}
    out: dict[str, Any] = {"window_s": seconds,
                           "mean_acceptance_length_since_start": _accept_length(after["drafts"], after["accepted_tokens"])}
    if drafts < 0 or accepted < 0:
        return {**unavailable("the server's counters went back during the window (it restarted)"), **out,
                "since_start": total}
    tokens = drafts + accepted
    decoding = drafts > 0 and seconds > 0
    return {"status": "decoding" if decoding else "idle", **out,
            "mean_acceptance_length": _accept_length(drafts, accepted),
            "decode_tokens_per_s": round(tokens / seconds, 1) if decoding else None,
            "window": {"drafts": int(drafts), "accepted_tokens": int(accepted), "tokens": int(tokens)},
            "since_start": total}


def described(live: dict[str, Any]) -> dict[str, Any]:
    """``live`` with where its figures come from and their ``definitions`` (what ``--json`` gives)."""
    return {**live, "source": f"{metrics_module().PREFIX}* on /metrics, read on the host", "definitions": DEFINITIONS}


def from_module(reply: dict[str, Any] | None, window: float) -> dict[str, Any]:
    """The live figures from what ``ddtree_probe`` returned as ``live_window`` (``probe --engine ansible``: the same
    two reads, made by the collection's module on the host)."""
    if window <= 0:
        return described(unavailable("not read (--live-window 0)"))
    if not isinstance(reply, dict):
        return described(unavailable("the ddtree_probe module returned no reads of /metrics"))
    return described(summarize(reply))


def read_live(host: Host, window: float = DEFAULT_WINDOW) -> dict[str, Any]:
    """The live figures of ``host``'s server (see the module docstring), with their ``definitions``; ``unavailable``
    with the reason when they cannot be had (no server configured, the server down or without DDTree's counters,
    the host unreachable): a read never fails for that."""
    if server_kind(host) == "none" or window <= 0:
        return read_on(None, host, window)
    try:
        with HostConnection(host) as conn:
            return read_on(conn, host, window)
    except (TransportError, OperationFailed) as exc:
        return described(unavailable(f"cannot read the server's counters: {exc.message}"))


def read_on(conn: HostConnection | None, host: Host, window: float = DEFAULT_WINDOW) -> dict[str, Any]:
    """:func:`read_live` on a connection the caller holds (``releases`` reads its host's state on it too); ``conn``
    is not used, and may be None, when nothing is to be read (no server, ``window`` 0)."""
    if server_kind(host) == "none":
        live = unavailable("no server configured (server.kind: none)")
    elif window <= 0:
        live = unavailable("not read (--live-window 0)")
    else:
        try:
            reply = conn.call("probe", "metrics_window", url=base_url(host), prefix=metrics_module().PREFIX,
                              seconds=float(window), timeout=float(window) + 30)
            live = summarize(reply)
        except (TransportError, OperationFailed) as exc:
            live = unavailable(f"cannot read the server's counters: {exc.message}")
    return described(live)


def cells(live: dict[str, Any]) -> list[str]:
    """The live table's row: accept length, decode tok/s, and what they cover."""
    status = live.get("status")
    if status == "decoding":
        w = live["window"]
        note = (f"last {round(live['window_s'], 3)} s: {w['tokens']} tokens in {w['drafts']} drafts; accept length since "
                f"start {live['mean_acceptance_length_since_start']}")
        return [str(live["mean_acceptance_length"]), str(live["decode_tokens_per_s"]), note]
    if status == "idle":
        since = live.get("mean_acceptance_length_since_start")
        return [f"{since} (since start)" if since is not None else "-", "idle",
                f"last {round(live['window_s'], 3)} s: nothing decoded"]
    return ["-", "-", str(live.get("reason") or "unavailable")]


__all__ = ["DEFAULT_WINDOW", "DEFINITIONS", "cells", "described", "from_module", "read_live", "read_on", "summarize",
           "unavailable"]
