"""Measuring a host's real server in several decoding configs, and leaving it exactly as it was.

Why restarts, not side servers: on a GPU host a second server would not fit beside the running one (the model and
its KV cache take the GPUs), and one that did would measure a contended machine. So ``bench`` and ``tune`` measure
the host's own server, restarted in each config (plain decoding, the DFlash chain, DDTree at some budget) on the
*active release*, and then restart it as the host file configures it and check it reports what it reported before.

Safety is the deploy transaction's: the whole measurement holds the host lock (no apply or server command can
interleave), every restart is a fenced step of the run, and the lock's guardian on the host puts the server back
as configured by itself when the tool is interrupted (Ctrl-C, SIGTERM), killed or cut off (the run touched the
server, so the guardian restarts it on the active release with the host file's flags). A failure the tool sees
(a config that does not start, a workload error) puts the server back before the error is reported.
"""
from __future__ import annotations

import dataclasses
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import DeployError, InputError, OperationFailed, is_cut
from .hostops import flag_drift
from .inventory import Host, server_setting
from .runtime_files import metrics_module
from .ddtree_stats import _first_state, ddtree_summary
from .server import ServerControl, base_url, require_server
from .spec_flags import budget_of, chain_flags, is_ddtree, with_budget, with_metrics
from .transaction import Progress, Run, quiet, run_on_host

#: The built-in workload: short prompts of different kinds (prose, code, lists, a question), each decoded to a fixed
#: length so every config does the same work.
BUILTIN_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of the planets of the solar system, in order from the sun:",
    "Question: why is the sky blue? Answer:",
    "Once upon a time, in a small village by the sea,",
    "SELECT name, count(*) FROM orders GROUP BY",
)
MAX_PROMPTS = 1000


def load_prompts(path: Path | None) -> list[str]:
    """The workload's prompts: one per line of ``path`` (blank lines skipped; a ``.jsonl`` file gives one JSON string
    or ``{"text": ...}`` per line), or the built-in mix. Bad input is an InputError naming the file and line."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    import json

    try:
        raw = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the prompts file: {exc}") from None
    prompts = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{path}:{n}: not JSON: {exc}") from None
            item = item.get("text") if isinstance(item, dict) else item
            if not isinstance(item, str) or not item:
                raise InputError(f"{path}:{n}: expected a JSON string or an object with a non-empty 'text'")
            line = item
        prompts.append(line)
    if not prompts:
        raise InputError(f"{path}: no prompts (one per line; blank lines are skipped)")
    if len(prompts) > MAX_PROMPTS:
        raise InputError(f"{path}: {len(prompts)} prompts; a measurement takes at most {MAX_PROMPTS}")
    return prompts


def comma_ints(text: str, what: str, example: str) -> list[int]:
    """``"1,4,8"`` -> [1, 4, 8], sorted and unique; an InputError naming the flag otherwise (exit 2, as a usage error).

    Kept a function the commands call rather than a click parameter type: the bounds of ``--budgets`` are the
    patch set's runtime's (``MAX_BUDGET`` of the schedule module, read when the command runs), so the check belongs
    to the module that owns the values, and the error leaves through the same one-line path as every other."""
    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"{what} {text!r}: expected comma-separated integers such as {example}") from None


def parse_sizes(text: str | None, what: str = "--batch-sizes") -> list[int] | None:
    """``"1,4,8"`` -> [1, 4, 8] (sorted, unique, each >= 1); None -> None."""
    if text is None:
        return None
    sizes = comma_ints(text, what, "1,4,8")
    if not sizes or sizes[0] < 1:
        raise InputError(f"{what} {text!r}: expected integers >= 1 such as 1,4,8")
    return sizes


@dataclass(frozen=True)
class Config:
    """One way of running the host's server: ``flags`` are the ``server.ddtree_flags`` to start with (None = plain
    decoding: the command without them)."""

    name: str
    flags: str | None
    budget: str | None = None

    @property
    def ddtree(self) -> bool:
        return self.flags is not None


def plain() -> Config:
    return Config("plain", None)


def chain(host: Host) -> Config:
    return Config("chain", with_metrics(chain_flags(str(host.server.get("ddtree_flags") or ""))), "0")


def ddtree(host: Host, budget: str | None = None, name: str | None = None) -> Config:
    """DDTree at ``budget`` (the host file's when None), started with ``/metrics`` on (``spec_flags.with_metrics``)
    so its per-depth acceptance is read from DDTree's own counters."""
    flags = str(host.server.get("ddtree_flags") or "")
    if budget is not None:
        flags = with_budget(flags, budget)
    b = budget_of(flags) or "16"
    return Config(name or f"ddtree-{b}", with_metrics(flags), b)


DEFAULT_REPS = 3


@dataclass
class Measurement:
    """One config at one batch size: what the client saw on the host (latencies carry no SSH) and what the server
    said about its speculation. Measured ``reps`` times in a row on the same server: each figure is the median of
    the reps, and ``tok_s_min``/``tok_s_max`` and ``round_ms_min``/``round_ms_max`` are their spread."""

    config: str
    budget: str | None
    batch: int
    requests: int
    tokens: int
    seconds: float
    tok_s: float
    accept_length: float | None
    latency_ms: float
    latency_p90_ms: float
    ms_per_token: float
    round_ms: float
    accept_stats: dict[str, Any] | None = field(default=None, repr=False)
    reps: int = 1
    #: per draft depth 1.., the share of drafts whose accepted path reached it during this cell (DDTree's /metrics
    #: counters, after minus before the workload); None where the server serves none
    accept_by_depth: list[float] | None = None
    tok_s_min: float = 0.0
    tok_s_max: float = 0.0
    round_ms_min: float = 0.0
    round_ms_max: float = 0.0

    def __post_init__(self) -> None:
        if self.reps == 1 and not self.tok_s_max:  # one rep: its own spread
            self.tok_s_min = self.tok_s_max = self.tok_s
            self.round_ms_min = self.round_ms_max = self.round_ms

    @property
    def spread(self) -> str:
        """``median (min–max) ×reps`` of tok/s, as tables show it."""
        return f"{self.tok_s:g} ({self.tok_s_min:g}–{self.tok_s_max:g}) x{self.reps}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("accept_stats")
        return d


def acceptance_stats(reply: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the server's cumulative acceptance counters, what this workload added) from a workload reply: DDTree's
    ``/metrics`` families when the server serves them (``source: metrics``; the runtime's ``metrics.acceptance``),
    else the reference engine's ``spec_accept_stats`` in ``/get_server_info`` (``source: server_info``; no delta)."""
    m = metrics_module()
    after = m.acceptance(reply.get("metrics_after") or "")
    if after is not None:
        return {"source": "metrics", **after}, m.difference(after, m.acceptance(reply.get("metrics_before") or ""))
    stats = _first_state((reply.get("server_info") or {}).get("info") or {}).get("spec_accept_stats")
    return ({"source": "server_info", **stats} if stats else None), None


def summarize(cfg: Config, reply: dict[str, Any]) -> Measurement:
    """Throughput, acceptance and latency of one workload reply (remote/probe.py ``workload``). A round is one
    verify pass for speculative configs and one decode step for plain decoding, so ``round_ms`` is comparable."""
    reqs = reply["requests"]
    tokens = sum(int(r["completion_tokens"]) for r in reqs)
    lat = sorted(float(r["latency"]) for r in reqs)
    rounds = [int(r.get("spec_verify_ct") or 0) for r in reqs]
    spec = cfg.ddtree and all(rounds)
    committed = sum(float(r["spec_accept_length"] or 0) * n for r, n in zip(reqs, rounds, strict=True)) if spec else 0.0
    accept = committed / sum(rounds) if spec else None
    per_round = [float(r["latency"]) / (n if spec else max(int(r["completion_tokens"]), 1)) for r, n in zip(reqs, rounds, strict=True)]
    stats, added = acceptance_stats(reply)
    by_depth = metrics_module().accept_by_depth(added) if added and added.get("drafts") else None
    return Measurement(cfg.name, cfg.budget, int(reply["concurrency"]), len(reqs), tokens, float(reply["seconds"]),
                       round(tokens / max(float(reply["seconds"]), 1e-9), 2), round(accept, 3) if accept else None,
                       round(1000 * statistics.mean(lat), 2), round(1000 * lat[int(0.9 * (len(lat) - 1))], 2),
                       round(1000 * sum(lat) / max(tokens, 1), 3), round(1000 * statistics.mean(per_round), 3), stats,
                       accept_by_depth=by_depth)


def combine(reps: list[Measurement]) -> Measurement:
    """The reps of one cell as one Measurement: medians, the tok/s and round-ms spread, the last rep's counters
    (the server's acceptance counters only grow, so the last holds every rep)."""
    if len(reps) == 1:
        return reps[0]

    def med(name: str) -> float:
        return round(statistics.median(getattr(m, name) for m in reps), 3)

    accept = [m.accept_length for m in reps if m.accept_length is not None]
    depths = [m.accept_by_depth for m in reps if m.accept_by_depth]
    first = reps[0]
    return Measurement(first.config, first.budget, first.batch, sum(m.requests for m in reps),
                       sum(m.tokens for m in reps), round(sum(m.seconds for m in reps), 3), med("tok_s"),
                       round(statistics.median(accept), 3) if accept else None, med("latency_ms"),
                       med("latency_p90_ms"), med("ms_per_token"), med("round_ms"), reps[-1].accept_stats,
                       reps=len(reps), tok_s_min=min(m.tok_s for m in reps), tok_s_max=max(m.tok_s for m in reps),
                       round_ms_min=min(m.round_ms for m in reps), round_ms_max=max(m.round_ms for m in reps),
                       accept_by_depth=[round(statistics.median(col), 4) for col in zip(*depths, strict=False)] if depths
                       else None)


class Session:
    """A measurement on one host under its lock: ``serve`` restarts the server in a config, ``measure`` runs the
    workload there, ``restore`` puts the server back as the host file configures it and checks it."""

    def __init__(self, run: Run, progress: Progress) -> None:
        self.run = run
        self.host = run.host
        self.progress = progress
        self.active = run.state.active
        self.url = base_url(self.host)
        self.before = self.server_info()
        # what the running server was started with against the host file now (a tune that wrote a schedule without
        # --apply leaves them apart): the restore starts the file's flags, so a difference there is expected
        self.drift = flag_drift(run.conn, self.host, self.active) if server_setting(self.host, "kind") != "none" else None
        self.serving: str | None = None
        self.restarts = 0
        self.restored: dict[str, Any] | None = None

    def server_info(self) -> dict[str, Any]:
        reply = self.run.conn.call("probe", "server_info", url=self.url, timeout=30)
        return reply.get("info") or {} if reply.get("status") == 200 else {}

    def serve(self, cfg: Config) -> None:
        """Restart the host's server in ``cfg`` on the active release and wait until it is up (the probe's start-up
        stage); a config that does not come up is an OperationFailed with the server's words."""
        if self.serving == cfg.name:
            return
        host = self.host if cfg.flags is None else dataclasses.replace(
            self.host, server={**self.host.server, "ddtree_flags": cfg.flags})
        self.progress(f"{self.host.name}: restarting the server for {cfg.name}"
                      + (f" ({cfg.flags})" if cfg.flags else " (no speculative flags)"))
        self.run.mgr.stage = f"bench {cfg.name}"
        self.serving = None
        self.restarts += 1
        ServerControl(self.run.conn, self.run.mgr.fence, host=host).restart(release=self.active, ddtree=cfg.ddtree)
        stage = self.run.prober.startup(self.active)
        if stage.status == "fail":
            tail = (stage.log_tail or "").strip().splitlines()[-1:] or [""]
            raise OperationFailed(f"host {self.host.name}: the server did not come up for {cfg.name}: {stage.detail}"
                                  + (f" (log: {tail[0][:200]})" if tail[0] else ""))
        self.serving = cfg.name

    def measure(self, cfg: Config, batch: int, prompts: list[str], max_new_tokens: int,
                reps: int = DEFAULT_REPS) -> Measurement:
        """The workload ``reps`` times in a row at ``batch`` requests in flight, on the server in ``cfg``."""
        self.serve(cfg)
        self.run.mgr.stage = f"bench {cfg.name} batch {batch}"
        budget = 60.0 + 2.0 * max_new_tokens * max(len(prompts), batch)
        metrics_prefix = metrics_module().PREFIX if cfg.ddtree else None
        done = []
        for _ in range(reps):
            reply = self.run.conn.call("probe", "workload", timeout=budget + 30, url=self.url, prompts=prompts,
                                       max_new_tokens=max_new_tokens, concurrency=batch, budget=budget,
                                       metrics_prefix=metrics_prefix)
            done.append(summarize(cfg, reply))
        m = combine(done)
        self.progress(f"{self.host.name}: {cfg.name} batch {batch}: {m.spread} tok/s (median (min–max) x reps), "
                      f"accept length {m.accept_length if m.accept_length is not None else '-'}, {m.latency_ms} ms "
                      "per request")
        return m

    def restore(self) -> dict[str, Any]:
        """Restart the server as configured (active release, the host file's flags) and compare what it reports
        with what it reported before the measurement."""
        self.run.mgr.stage = "bench: restoring the server"
        self.progress(f"{self.host.name}: putting the server back as configured")
        ServerControl(self.run.conn, self.run.mgr.fence).restart(release=self.active, ddtree=self.active is not None)
        stage = self.run.prober.startup(self.active)
        if stage.status == "fail":
            raise OperationFailed(f"host {self.host.name}: the server did not come back up as configured after the "
                                  f"measurement: {stage.detail}", hint=f"ddtree-deploy server restart {self.host.name}")
        after = self.server_info()
        was, now = ddtree_summary(self.before, None, None), ddtree_summary(after, None, None)
        keys = ("algorithm", "budget")
        same = all(was.get(k) == now.get(k) for k in keys)
        self.restored = {"release": self.active, "same_config": same, "before": {k: was.get(k) for k in keys},
                         "after": {k: now.get(k) for k in keys}, "restarts": self.restarts + 1}
        if not same and self.drift:  # the host file changed since the server's last start: it runs the file's now
            self.restored["flag_drift"] = self.drift
            self.progress(f"{self.host.name}: the server now runs the host file's flags ({self.restored['after']}); "
                          f"before the measurement it ran {self.restored['before']}, started before the host file "
                          f"changed ({'; '.join(self.drift)})")
        elif not same:
            raise OperationFailed(f"host {self.host.name}: after the measurement the server reports "
                                  f"{self.restored['after']}, before it reported {self.restored['before']}")
        return self.restored


@contextmanager
def measuring(host: Host, command: str, progress: Progress = quiet) -> Iterator[Session]:
    """Hold the host for a measurement: the server must be up on an overlay release (DDTree and the chain come from
    the overlay); on leaving — normally or by an error the tool sees — the server is put back as configured."""
    require_server(host)
    if not is_ddtree(str(host.server.get("ddtree_flags") or "")):
        raise InputError(f"{host.source}: field 'server.ddtree_flags' does not run DDTree "
                         f"({host.server.get('ddtree_flags')!r}); expected --speculative-algorithm DFLASH "
                         "--speculative-ddtree-budget N")
    with run_on_host(host, command, progress=progress) as run:
        if run.state.active is None:
            raise InputError(f"host {host.name}: no overlay release is active, so neither the chain nor DDTree can run "
                             f"there", hint=f"ddtree-deploy apply --host {host.name}")
        session = Session(run, progress)
        if not session.before or session.before.get("ready") is False:
            raise OperationFailed(f"host {host.name}: its server is not up ({session.url}/get_server_info does not "
                                  "answer); bench and tune measure the running server",
                                  hint=f"ddtree-deploy server start {host.name}")
        try:
            yield session
        except DeployError as exc:
            if is_cut(exc) or session.restarts == 0:
                raise
            try:
                session.restore()
            except DeployError as again:
                raise OperationFailed(f"{exc}; then putting the server back failed too: {again}") from exc
            raise
        else:
            if session.restarts:
                session.restore()
            else:
                session.restored = {"release": session.active, "same_config": True, "restarts": 0}


def bench(host: Host, prompts: list[str], batch_sizes: list[int], max_new_tokens: int, *, reps: int = DEFAULT_REPS,
          progress: Progress = quiet) -> dict[str, Any]:
    """plain / chain / DDTree (the host file's budget) side by side at each batch size. The running server is
    measured first as it is (it runs the host file's DDTree config), then restarted for the chain and for plain
    decoding, then put back."""
    own = ddtree(host, name="ddtree")
    rows: list[Measurement] = []
    with measuring(host, "ddtree-deploy bench", progress) as s:
        now = ddtree_summary(s.before, None, None)
        if str(now.get("budget")) == str(own.budget):
            s.serving = own.name  # already running it: no restart
        for cfg in (own, chain(host), plain()):
            for bs in batch_sizes:
                rows.append(s.measure(cfg, bs, prompts, max_new_tokens, reps))
    return {"host": host.name, "release": s.active, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "batch_sizes": batch_sizes, "reps": reps, "rows": [r.to_dict() for r in rows], "restored": s.restored}


def plan(host: Host, configs: list[Config], batch_sizes: list[int] | None, *, reps: int = DEFAULT_REPS,
         running: str | None = None) -> list[str]:
    """What a measurement would do, for --dry-run (nothing is restarted or written). ``running``: the budget the
    server runs now, when the caller read it (the first config is measured as it runs when it is that budget);
    ``batch_sizes`` None: the sizes in use on the server."""
    sizes = ", ".join(map(str, batch_sizes)) if batch_sizes else "the sizes in use on the server"
    lines = [f"take the host lock of {host.name}; check its server is up on an overlay release"]
    restarts = 0
    for i, cfg in enumerate(configs):
        as_is = i == 0 and cfg.flags is not None and (cfg.name == "ddtree" if running is None else cfg.budget == running)
        restarts += not as_is
        how = "measure the server as it runs" if as_is else "restart the server"
        lines.append(f"{how} for {cfg.name} ({cfg.flags or 'no speculative flags'}); run the workload {reps} times "
                     f"at batch {sizes} (median and min–max of each cell)")
    lines.append("restart the server as the host file configures it and check it reports the same config "
                 f"({restarts + 1} restarts in all)")
    return lines


__all__ = ["BUILTIN_PROMPTS", "DEFAULT_REPS", "Config", "Measurement", "combine", "Session", "bench", "chain", "ddtree", "load_prompts",
           "measuring", "parse_sizes", "plain", "plan", "summarize"]
