"""What every command that changes a host shares: the run report, the host lock with its guardian, and settling
what a vanished run left behind before doing anything else.

The invariant (docs/design.md, "The deploy transaction"): at every instant a host is on its last good release, or
on a new release that a run is probing and will roll back on any failure or interruption. The pieces:

- ``ReleaseManager.locked`` (release.py) holds the host lock through a guardian process on the host; Ctrl-C,
  SIGTERM, kill -9 of this process or a cut connection make the guardian roll back whatever is pending itself.
- ``run_on_host`` opens a connection and the lock for one command, and first settles a pending switch that nobody
  settled (the guardian died with the host: a reboot, an OOM kill): probed and kept, or rolled back, and said so.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from . import hostpaths
from .errors import EXIT_OK
from .hoststate import ReleaseState
from .inventory import Host, probe_setting
from .probe import Prober, ProbeResult, guard_spec
from .release import ReleaseManager, describe_settlement, new_run_id
from .server import ServerControl
from .transport import HostConnection

Progress = Callable[[str], None]
#: How long a command waits for the host to finish settling a run that vanished a moment ago, before refusing.
SETTLING_WAIT = 120.0


def quiet(msg: str) -> None:
    pass


@dataclass
class ApplyReport:
    """What happened on one host. ``status``: ok | unchanged | rolled-back | rollback-failed | refused | failed |
    dry-run."""

    host: str
    status: str
    message: str = ""
    exit_code: int = EXIT_OK
    release: str | None = None
    previous: str | None = None
    rolled_back_to: str | None = None
    push: dict[str, Any] | None = None
    probe: ProbeResult | None = None
    rollback_probe: ProbeResult | None = None
    timings: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "unchanged", "dry-run")

    @property
    def went_back(self) -> bool:
        """The host went back to ``rolled_back_to``: rolled back by the run, or settled so after a cut or Ctrl-C."""
        settled = self.details.get("settled") or {}
        return self.status in ("rolled-back", "rollback-failed") or \
            (settled.get("action") or settled.get("outcome")) == "rolled-back"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "status": self.status, "ok": self.ok, "exit_code": self.exit_code, "message": self.message,
            "release": self.release, "previous": self.previous, "rolled_back_to": self.rolled_back_to, "push": self.push,
            "probe": self.probe.to_dict() if self.probe else None,
            "rollback_probe": self.rollback_probe.to_dict() if self.rollback_probe else None,
            "timings": {k: round(v, 3) for k, v in self.timings.items()}, "details": self.details,
        }


@dataclass
class Run:
    """One command's hold on a host: the connection, the release manager holding the lock, the server and prober
    acting as steps of the run, and what was found and settled when the lock was taken."""

    host: Host
    conn: HostConnection
    mgr: ReleaseManager
    ctl: ServerControl
    prober: Prober
    lock_info: dict[str, Any]
    settled: str | None = None  # what was done about a pending switch left by a vanished run
    settled_probe: ProbeResult | None = None  # the probe that kept a pending release (probe_pending)
    settled_outcome: dict[str, Any] | None = None  # what the host did to settle it (rolled back: from which, to which)

    @property
    def state(self) -> ReleaseState:
        """The host's release state as the lock found it (after settling what a vanished run left pending)."""
        return ReleaseState.of(self.lock_info["state"])


@contextmanager
def run_on_host(host: Host, command: str, *, break_lock: bool = False, progress: Progress = quiet,
                facts: dict[str, Any] | None = None, run_id: str | None = None, probe_pending: bool = False) -> Iterator[Run]:
    """Connect, take the host lock (held by the host's guardian for this run), say what was recovered or broken,
    and settle a switch that a vanished run left pending (``probe_pending``: probe it first, as it runs, and keep it
    if it passes, which needs the server to be running it already: the probe checks where the server loaded DDTree
    from; else, or when it fails, roll it back). The block then works on a host that is on a good release."""
    with HostConnection(host) as conn:
        hostpaths.check(conn, host)  # before the lock: a root that resolves into the package gets nothing written
        mgr = ReleaseManager(conn, run_id or new_run_id())
        mgr.notify = lambda message: progress(f"{host.name}: {message}")
        with mgr.locked(command, break_lock=break_lock, guard=guard_spec(host), wait=SETTLING_WAIT) as info:
            if info.get("broken"):
                progress(f"{host.name}: broke the lock held by run {info['broken'].get('run_id')}")
            if info.get("recovered"):
                progress(f"{host.name}: took over the lock of a run that is gone ({info.get('recovered_why')})")
            if info.get("untold"):  # the guardian settled an earlier run whose tool never said so (killed, cut off)
                told = info["untold"]
                progress(f"{host.name}: the previous run {told.get('run')} stopped early ({told.get('why')}); "
                         f"its guardian settled it: {describe_settlement(told)}")
            run = Run(host, conn, mgr, ServerControl(conn, mgr.fence), Prober(conn, facts=facts, progress=progress, fence=mgr.fence), info)
            pending = ReleaseState.of(info["state"]).pending
            if pending:
                run.settled = _settle_pending(run, pending, probe_pending, progress)
                info["state"] = mgr.show()["state"]
            yield run


def _settle_pending(run: Run, pending: Mapping[str, Any], probe_first: bool, progress: Progress) -> str:
    host, mgr = run.host, run.mgr
    rel = pending.get("release")
    what = f"release {rel}" if rel else "the installed package"
    head = f"found {what} switched in by run {pending.get('run')} (stage {pending.get('stage')}) and never probed"
    if probe_first and rel is not None and pending.get("safe") != rel:
        mgr.stage = "probe of a pending release"
        result = run.prober.run(rel, label="probe (pending release)")
        if result.ok:
            run.settled_probe = result
            run.settled_outcome = {"action": "probed-good", "release": rel, "to": rel}
            mgr.finish(rel, "good", "reconciled", outcome="probed-good", release=rel, left_by=pending.get("run"))
            message = f"{head}; probed it: it passes, so it stays active (marked good)"
            progress(f"{host.name}: {message}")
            return message
        stage = result.failed_stage
        head += f"; probed it: {stage.name if stage else 'probe'} failed ({stage.detail if stage else '?'})"
    outcome = mgr.reconcile(f"left pending by run {pending.get('run')}", guard_spec(host),
                            timeout=60 + float(probe_setting(host, "startup_timeout")))
    run.settled_outcome = outcome
    message = f"{head}; {describe_settlement(outcome)}"
    progress(f"{host.name}: {message}")
    return message


__all__ = ["ApplyReport", "Progress", "Run", "SETTLING_WAIT", "quiet", "run_on_host"]
