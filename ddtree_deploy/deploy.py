"""``apply``: patch set → overlay → ABI check → lock → push → switch → restart → probe → rollback on failure.

Two entry points: ``apply(host, ...)`` runs the whole flow from the host's snapshot and patch set (what the CLI
and ``make demo`` call), and ``deploy_overlay(host, overlay, ...)`` runs everything from the lock on with an
overlay built elsewhere (tests, or a caller that already has one). ``rollback`` is the hand-driven way back.

Order on the host, and why:
  switch → overlay + selftest stages → restart → startup + generation stages
The checks that need no server run before the restart, so a release that cannot even be imported is refused
while the old server keeps serving; the crash clock starts at the real start. On a failed probe the release
is marked bad, ``current`` goes back to the recorded previous good release (or to the installed package when
there was none), the server is restarted only if it already ran the failed release, and the host is probed
again; both probes are reported, and the run exits 1 either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import AbiIncompatible, DeployError, EXIT_FAILED, EXIT_OK, InputError, OperationFailed
from .inventory import Host
from .overlay import Overlay
from .probe import Prober, ProbeResult, Stage
from .release import PushResult, ReleaseManager, new_run_id, rollback_target
from .server import ServerControl, require_server
from .transport import HostConnection

Progress = Callable[[str], None]


@dataclass
class ApplyReport:
    """What happened on one host. ``status``: ok | rolled-back | rollback-failed | refused | failed | dry-run."""

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
        return self.status in ("ok", "dry-run")

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "status": self.status, "ok": self.ok, "exit_code": self.exit_code, "message": self.message,
            "release": self.release, "previous": self.previous, "rolled_back_to": self.rolled_back_to, "push": self.push,
            "probe": self.probe.to_dict() if self.probe else None,
            "rollback_probe": self.rollback_probe.to_dict() if self.rollback_probe else None,
            "timings": {k: round(v, 3) for k, v in self.timings.items()}, "details": self.details,
        }


def _quiet(msg: str) -> None:
    pass


# -- from the lock on ------------------------------------------------------------------------------------------------------
def deploy_overlay(host: Host, overlay: Overlay, *, break_lock: bool = False, command: str = "ddtree-deploy apply",
                   record_baseline: bool = True, facts: dict[str, Any] | None = None, extra_meta: dict[str, Any] | None = None,
                   progress: Progress = _quiet, run_id: str | None = None) -> ApplyReport:
    """Lock the host, push ``overlay`` as a new release, switch, restart, probe; roll back when the probe fails.

    Raises DeployError only for failures before anything was switched (lock held, push failed, host unreachable):
    the host is then exactly as it was. Everything after the switch is reported in the ApplyReport.
    """
    require_server(host)
    timings: dict[str, float] = {}
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn, run_id or new_run_id())
        ctl = ServerControl(conn)
        prober = Prober(conn, facts=facts, progress=progress)
        t = time.monotonic()
        with mgr.locked(command, break_lock=break_lock) as lock_info:
            if lock_info.get("broken"):
                progress(f"{host.name}: broke the lock held by {lock_info['broken'].get('run_id')}")
            timings["lock"] = time.monotonic() - t
            previous = lock_info["state"]["active"]
            if record_baseline and host.probe.get("prompts") and not lock_info.get("has_baseline"):
                progress(f"{host.name}: no generation baseline yet: recording one with DDTree off")
                t = time.monotonic()
                prober.record_baseline(ddtree=False)
                timings["baseline"] = time.monotonic() - t
            progress(f"{host.name}: pushing {len(overlay.files)} overlay files")
            t = time.monotonic()
            pushed: PushResult = mgr.push(overlay, extra_meta=extra_meta, switch=True)  # one round trip for both
            timings["push_switch"] = time.monotonic() - t
            progress(f"{host.name}: switched current → {pushed.release_id}; probing")
            report = ApplyReport(host.name, "ok", release=pushed.release_id, previous=previous,
                                 push={"release": pushed.release_id, "seconds": round(pushed.seconds, 3),
                                       "link_mode": pushed.link_mode, "files": pushed.files, "bytes": pushed.bytes_sent},
                                 timings=timings)
            restarted = [False]

            def restart() -> None:
                progress(f"{host.name}: restarting the server on {pushed.release_id}")
                ctl.restart(release=pushed.release_id, ddtree=True)
                restarted[0] = True

            t = time.monotonic()
            try:
                probe = prober.run(pushed.release_id, restart=restart, label="probe")
            except DeployError as exc:  # e.g. the restart itself failed: still a failed probe, still rolled back
                probe = ProbeResult(host.name, pushed.release_id, [Stage("probe", "fail", time.monotonic() - t, str(exc))])
                restarted[0] = True
            timings["probe"] = time.monotonic() - t
            report.probe = probe
            if probe.ok:
                removed = mgr.finish(pushed.release_id, "good", "apply", release=pushed.release_id, outcome="ok",
                                     previous=previous)
                report.details["removed_releases"] = removed
                report.message = f"release {pushed.release_id} active and healthy"
                return report
            stage = probe.failed_stage
            why = f"probe stage {stage.name} failed: {stage.detail}" if stage else "probe failed"
            progress(f"{host.name}: {why}; rolling back")
            t = time.monotonic()
            _roll_back(mgr, ctl, prober, report, failed=pushed.release_id, why=why, server_ran_failed=restarted[0])
            timings["rollback"] = time.monotonic() - t
            return report


def _roll_back(mgr: ReleaseManager, ctl: ServerControl, prober: Prober, report: ApplyReport, *, failed: str,
               why: str, server_ran_failed: bool) -> None:
    """Switch back to the previous good release, mark ``failed`` bad, restart if needed, re-probe; fill ``report``."""
    state = mgr.show()["state"]
    target = rollback_target(state, failed)
    mgr.switch(target, reason="rollback", mark_bad=failed, note=why[:500])
    report.rolled_back_to = target
    # restart only if the server ran (or tried to run) the failed release, or is not running at all
    needs_restart = server_ran_failed or not ctl.status().get("running")
    restart = (lambda: ctl.restart(release=target, ddtree=target is not None)) if needs_restart else None
    second = prober.run(target, restart=restart, label="after rollback")
    report.rollback_probe = second
    where = f"release {target}" if target else "the installed package (no overlay)"
    if second.ok:
        report.status = "rolled-back"
        report.message = f"{why}; rolled back to {where}, which passes its probe"
        mgr.finish(target, "good" if target else None, "apply", release=failed, outcome="rolled-back",
                   rolled_back_to=target, why=why[:500])
    else:
        stage = second.failed_stage
        report.status = "rollback-failed"
        report.message = (f"{why}; ROLLBACK TO {where.upper()} ALSO FAILED its probe"
                          f" ({stage.name if stage else '?'}: {stage.detail if stage else '?'}) — the host needs attention")
        mgr.finish(None, None, "apply", release=failed, outcome="rollback-failed", rolled_back_to=target, why=why[:500])
    report.exit_code = EXIT_FAILED


# -- the whole flow ----------------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """What apply would push: the overlay, its diff against the base, and the ABI verdict."""

    host: str
    overlay: Overlay
    diff: str
    findings: list[Any]
    abi_errors: bool
    snapshot_id: str
    base_version: str
    facts: dict[str, Any] | None

    def abi_dicts(self) -> list[dict[str, Any]]:
        return [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in self.findings]


DEFAULT_PATCHSET = "ddtree"


def plan(host: Host, *, patchset: str | None = None, max_snapshot_age: float = 3600.0, progress: Progress = _quiet) -> Plan:
    """Resolve the patch set for the host's base version, build the overlay off-host from the host's latest
    snapshot (taking one if there is none or it is older than ``max_snapshot_age`` seconds), and run the ABI
    check. Touches nothing on the host (taking a snapshot only reads it)."""
    from . import abi as abi_mod
    from .patchset import SnapshotBase, build_overlay, find_patchset_for, render_diff
    from .snapshot import SnapshotStore

    store = SnapshotStore()
    snap = store.latest(host.name)
    if snap is None or _stale(snap.created, max_snapshot_age):
        progress(f"{host.name}: taking a snapshot of the installed sglang")
        snap = store.take(host)
    facts = snap.facts
    base_version = str(snap.package_version or "")
    if not base_version:
        raise OperationFailed(f"host {host.name}: snapshot {snap.id} does not record the installed sglang version")
    ps = find_patchset_for(patchset or DEFAULT_PATCHSET, base_version)
    base = SnapshotBase(snap, store=store)
    progress(f"{host.name}: applying patch set {ps.name} {ps.version} to snapshot {snap.id} (sglang {base_version})")
    overlay = build_overlay(ps, base)
    diff = render_diff(overlay, base)
    carries_compiled = any(f.path.endswith((".so", ".pyd")) for f in overlay.files)
    findings = abi_mod.check_overlay(host.name, facts, built_from_facts=facts, carries_compiled=carries_compiled,
                                     requires=dict(ps.requires), base_version=ps.base_version)
    return Plan(host.name, overlay, diff, findings, abi_mod.has_errors(findings), str(snap.id), base_version, facts)


def _stale(created: Any, max_age: float) -> bool:
    from datetime import datetime

    try:
        stamp = datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    return time.time() - stamp > max_age


def apply(host: Host, *, patchset: str | None = None, dry_run: bool = False, ignore_abi: bool = False,
          break_lock: bool = False, record_baseline: bool = True, progress: Progress = _quiet,
          command: str = "ddtree-deploy apply") -> ApplyReport:
    """The whole flow for one host. Raises DeployError (with its exit code) for refusals before any change:
    patch set missing or not applying (2/5), ABI errors (4), host unreachable (3), lock held or push failed (1)."""
    if not dry_run:
        require_server(host)  # a host we could not restart is refused before anything else happens
    t = time.monotonic()
    p = plan(host, patchset=patchset, progress=progress)
    plan_s = time.monotonic() - t
    details = {"patchset": p.overlay.patchset, "patchset_version": p.overlay.patchset_version,
               "base_version": p.base_version, "snapshot": p.snapshot_id, "abi": p.abi_dicts(), "files": len(p.overlay.files)}
    if dry_run:
        return ApplyReport(host.name, "dry-run", message=f"would push {len(p.overlay.files)} files "
                           f"({p.overlay.patchset} {p.overlay.patchset_version} on sglang {p.base_version}); "
                           f"ABI: {'ERRORS' if p.abi_errors else 'ok'}", timings={"plan": plan_s},
                           details={**details, "diff": p.diff, "abi_errors": p.abi_errors})
    if p.abi_errors and not ignore_abi:
        errors = [f"{d.get('rule')}: {d.get('what')} (fix: {d.get('fix')})" for d in p.abi_dicts() if d.get("severity") == "error"]
        raise AbiIncompatible(f"host {host.name}: ABI check failed; nothing was pushed\n  " + "\n  ".join(errors),
                              hint="fix the host or rebuild for it; --ignore-abi pushes anyway (dangerous)")
    if p.abi_errors:
        progress(f"[bold red]{host.name}: WARNING: pushing despite ABI errors (--ignore-abi)[/bold red]")
    report = deploy_overlay(host, p.overlay, break_lock=break_lock, command=command, record_baseline=record_baseline,
                            facts=p.facts, progress=progress,
                            extra_meta={"abi_ignored": bool(p.abi_errors and ignore_abi), "snapshot": p.snapshot_id})
    report.timings = {"plan": plan_s, **report.timings}
    report.details.update(details)
    return report


# -- by hand ---------------------------------------------------------------------------------------------------------------------
def rollback(host: Host, *, to: str | None = None, to_installed: bool = False, break_lock: bool = False,
             progress: Progress = _quiet) -> ApplyReport:
    """Switch back by hand: to ``to``, to the installed package, or to the recorded rollback target of the active
    release; mark the release we leave bad, restart, and probe."""
    require_server(host)
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        ctl = ServerControl(conn)
        prober = Prober(conn, progress=progress)
        with mgr.locked("ddtree-deploy rollback", break_lock=break_lock) as lock_info:
            state = lock_info["state"]
            active = state["active"]
            if to_installed:
                target = None
            elif to is not None:
                ids = [r["id"] for r in state["releases"]]
                if to not in ids:
                    raise InputError(f"host {host.name}: no release {to!r} (have: {', '.join(ids) or 'none'})")
                target = to
            else:
                if active is None:
                    raise InputError(f"host {host.name}: no overlay is active; nothing to roll back")
                target = rollback_target(state, active)
            if target == active:
                raise InputError(f"host {host.name}: {target or 'the installed package'} is already active")
            mgr.switch(target, reason="rollback", mark_bad=active, note="rolled back by hand")
            report = ApplyReport(host.name, "ok", release=target, previous=active, rolled_back_to=target)
            report.probe = prober.run(target, restart=lambda: ctl.restart(release=target, ddtree=target is not None),
                                      label="after rollback")
            if report.probe.ok:
                report.message = f"rolled back from {active or 'the installed package'} to {target or 'the installed package'}"
            else:
                report.status = "rollback-failed"
                report.exit_code = EXIT_FAILED
                report.message = f"ROLLED BACK TO {target or 'the installed package'} BUT ITS PROBE FAILED — the host needs attention"
            mgr.finish(target if report.probe.ok else None, "good" if report.probe.ok and target else None, "rollback",
                       **{"from": active, "to": target, "outcome": report.status})
            return report


def probe(host: Host, *, record: bool = False, record_with_ddtree: bool = False, progress: Progress = _quiet) -> tuple[ProbeResult, dict | None]:
    """Probe the running server against the active release (optionally recording the baseline first)."""
    require_server(host)
    with HostConnection(host) as conn:
        prober = Prober(conn, progress=progress)
        baseline = None
        if record:
            mgr = ReleaseManager(conn)
            with mgr.locked("ddtree-deploy probe --record-baseline"):
                baseline = prober.record_baseline(ddtree=record_with_ddtree)
        active = conn.call("release", "show", root=host.release_root)["state"]["active"]
        return prober.run(active), baseline


def releases(host: Host, journal_lines: int = 10) -> dict[str, Any]:
    with HostConnection(host) as conn:
        return ReleaseManager(conn).show(journal_lines)


__all__ = ["ApplyReport", "Plan", "apply", "deploy_overlay", "plan", "probe", "releases", "rollback"]
