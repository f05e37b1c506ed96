"""``apply``: patch set → overlay → ABI check → lock → push → switch → restart → probe → rollback on failure.

Two entry points: ``apply(host, ...)`` runs the whole flow from the host's snapshot and patch set (what the CLI
and ``make demo`` call), and ``deploy_overlay(host, overlay, ...)`` runs everything from the lock on with an
overlay built elsewhere (tests, or a caller that already has one). The hand-driven commands (rollback, probe,
server) live in ``hostops``.

Order on the host, and why:
  push (build only) → switch (pending recorded first) → overlay + selftest stages → restart → startup + generation
The build commits its release only while this run holds the lock and its connection lives; the switch is a separate
round trip after the build's answer arrived, and writes `pending` (the release to go back to) before `current`
moves. The checks that need no server run before the restart, so a release that cannot even be imported is refused
while the old server keeps serving; the crash clock starts at the real start. On a failed probe the release is
marked bad, ``current`` goes back to the recorded previous good release (or to the installed package when there was
none), the server is restarted only if it already ran the failed release, and the host is probed again; both
probes are reported, and the run exits 1 either way. Any interruption on the way (Ctrl-C, SIGTERM, kill -9, a cut
connection) is settled by the host's guardian: see ``release.Lease`` and docs/design.md.

Re-applying the overlay that is already active and passing its probe changes nothing ("unchanged": no release, no
restart); ``force`` redoes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from . import baseline as baseline_mod
from . import dryrun
from .errors import AbiIncompatible, DeployError, EXIT_FAILED, InputError, OperationFailed, is_cut
from .inventory import Host
from .overlay import Overlay
from .ddtree_stats import describe_ddtree
from .probe import ProbeResult, Stage
from .release import PushResult, rollback_target
from .server import require_server, server_spec
from .transaction import ApplyReport, Progress, Run, quiet, run_on_host
from .launch_check import check_launch_line

_quiet = quiet


# -- from the lock on ------------------------------------------------------------------------------------------------------
def deploy_overlay(host: Host, overlay: Overlay, *, break_lock: bool = False, command: str = "ddtree-deploy apply",
                   record_baseline: bool = True, facts: dict[str, Any] | None = None, extra_meta: dict[str, Any] | None = None,
                   progress: Progress = _quiet, run_id: str | None = None, force: bool = False,
                   base_hashes: dict[str, str] | None = None, allow_base_drift: bool = False) -> ApplyReport:
    """Lock the host, push ``overlay`` as a new release, switch, restart, probe; roll back when the probe fails.

    Raises DeployError only for failures before anything was switched (lock held, push failed, base drift, host
    unreachable) and for interruptions (Interrupted, ConnectionCut: their message says how the host settled the
    run). Everything after the switch is reported in the ApplyReport.
    """
    require_server(host)
    timings: dict[str, float] = {}
    t = time.monotonic()
    with run_on_host(host, command, break_lock=break_lock, progress=progress, facts=facts, run_id=run_id) as run:
        timings["lock"] = time.monotonic() - t
        mgr, prober = run.mgr, run.prober
        previous = run.state["active"]
        details: dict[str, Any] = {"reconciled": run.settled} if run.settled else {}
        if not force:
            same = _unchanged(run, overlay, progress)
            if same is not None:
                same.details.update(details)
                return same
        if record_baseline and host.probe.get("prompts") and not run.lock_info.get("has_baseline"):
            progress(f"{host.name}: no generation baseline yet: recording one with DDTree off")
            t = time.monotonic()
            mgr.stage = "baseline"
            baseline_mod.record_baseline(prober, run.ctl, ddtree=False)
            timings["baseline"] = time.monotonic() - t
        progress(f"{host.name}: pushing {len(overlay.files)} overlay files")
        t = time.monotonic()
        pushed: PushResult = mgr.push(overlay, extra_meta=extra_meta, base_hashes=base_hashes, allow_base_drift=allow_base_drift)
        if pushed.base_drift:
            details["base_drift"] = pushed.base_drift
            progress(f"[bold red]{host.name}: WARNING: pushed despite base drift (--allow-base-drift): "
                     f"{'; '.join(pushed.base_drift[:3])}[/bold red]")
        details["launch_line"] = check_launch_line(run.conn, host, pushed.release_id)  # before the switch
        mgr.switch(pushed.release_id, probing=True)
        timings["push_switch"] = time.monotonic() - t
        progress(f"{host.name}: switched current → {pushed.release_id}; probing")
        report = ApplyReport(host.name, "ok", release=pushed.release_id, previous=previous,
                             push={"release": pushed.release_id, "seconds": round(pushed.seconds, 3),
                                   "link_mode": pushed.link_mode, "files": pushed.files, "bytes": pushed.bytes_sent},
                             timings=timings, details=details)
        t = time.monotonic()
        mgr.stage = "probe"
        restarted = False  # whether the server ran (or may have run) the new release: the rollback then restarts it
        try:
            checked = prober.check_release(pushed.release_id)
            if all(s.status != "fail" for s in checked):
                progress(f"{host.name}: restarting the server on {pushed.release_id}")
                mgr.stage = "restart"
                restarted = True
                run.ctl.restart(release=pushed.release_id, ddtree=True)
                mgr.stage = "probe"
            probe = prober.check_serving(pushed.release_id, checked, label="probe")
        except DeployError as exc:  # e.g. the restart itself failed: still a failed probe, still rolled back
            if is_cut(exc):
                raise  # the connection is gone or the host gave the run up: the host settles it (release.Lease)
            probe = ProbeResult(host.name, pushed.release_id, [Stage("probe", "fail", time.monotonic() - t, str(exc))])
            restarted = True
        timings["probe"] = time.monotonic() - t
        report.probe = probe
        if probe.ok:
            mgr.stage = "finish"
            removed = mgr.finish(pushed.release_id, "good", "apply", release=pushed.release_id, outcome="ok",
                                 previous=previous, ddtree=probe.ddtree or None)
            report.details["removed_releases"] = removed
            report.message = f"release {pushed.release_id} active and healthy"
            return report
        stage = probe.failed_stage
        why = f"probe stage {stage.name} failed: {stage.detail}" if stage else "probe failed"
        progress(f"{host.name}: {why}; rolling back")
        t = time.monotonic()
        _roll_back(run, report, failed=pushed.release_id, why=why, server_ran_failed=restarted)
        timings["rollback"] = time.monotonic() - t
        return report


def _unchanged(run: Run, overlay: Overlay, progress: Progress) -> ApplyReport | None:
    """The overlay is what the active release holds and it passes its probe: nothing to do (no release, no restart)."""
    state = run.state
    active = state["active"]
    rel = next((r for r in state["releases"] if r["id"] == active), None) if active else None
    if rel is None or rel.get("overlay_digest") != overlay.digest or rel.get("status") != "good":
        return None
    run.mgr.stage = "probe"
    progress(f"{run.host.name}: release {active} already holds this overlay; probing it as it runs")
    probe = run.prober.run(active, label="probe (unchanged)")
    if not probe.ok:
        stage = probe.failed_stage
        progress(f"{run.host.name}: release {active} holds this overlay but fails its probe "
                 f"({stage.name if stage else '?'}: {stage.detail if stage else '?'}); deploying it again")
        return None
    run.mgr.finish(None, None, "apply", release=active, outcome="unchanged")
    return ApplyReport(run.host.name, "unchanged", release=active, previous=active, probe=probe,
                       message=f"release {active} already holds this overlay and passes its probe: unchanged "
                               "(no new release, no restart; --force redoes it)")


def _roll_back(run: Run, report: ApplyReport, *, failed: str, why: str, server_ran_failed: bool) -> None:
    """Switch back to the previous good release, mark ``failed`` bad, restart if needed, re-probe; fill ``report``."""
    mgr, ctl, host = run.mgr, run.ctl, run.host
    state = mgr.show()["state"]
    target = rollback_target(state, failed)
    # restart only if the server ran (or tried to run) the failed release, or is not running at all
    needs_restart = server_ran_failed or not ctl.status().get("running")
    mgr.roll_back(target, failed=failed, note=why[:500], spec=server_spec(host) if needs_restart else None,
                  timeout=float(host.server.get("stop_timeout", 20.0)) + 90)
    report.rolled_back_to = target
    mgr.stage = "probe after rollback"
    second = run.prober.run(target, label="after rollback")
    report.rollback_probe = second
    where = f"release {target}" if target else "the installed package (no overlay)"
    mgr.stage = "finish"
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
    """What apply would push: the overlay, its diff against the base, the ABI verdict, and the snapshot's hashes of
    the files it replaces (the host checks them before building)."""

    host: str
    overlay: Overlay
    diff: str
    findings: list[Any]
    abi_errors: bool
    snapshot_id: str
    base_version: str
    facts: dict[str, Any] | None
    base_hashes: dict[str, str]

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
    progress(f"{host.name}: applying patch set {ps.name} {ps.version} to snapshot {snap.id} (sglang {base_version})")
    try:
        base = SnapshotBase(snap, store=store)
        overlay = build_overlay(ps, base)
        diff = render_diff(overlay, base)
    except InputError as exc:
        if "store corrupted" not in exc.message and "missing from the store" not in exc.message:
            raise
        # a damaged blob: the host is the source of truth; a fresh snapshot fetches what the store lost
        progress(f"{host.name}: {exc.message}; taking a fresh snapshot to repair the store")
        snap = store.take(host)
        base = SnapshotBase(snap, store=store)
        overlay = build_overlay(ps, base)
        diff = render_diff(overlay, base)
    carries_compiled = any(f.path.endswith((".so", ".pyd")) for f in overlay.files)
    findings = abi_mod.check_overlay(host.name, facts, built_from_facts=facts, carries_compiled=carries_compiled,
                                     requires=dict(ps.requires), base_version=ps.base_version)
    manifest = snap.manifest
    hashes = {f.path: manifest[f.path]["sha256"] for f in overlay.files if f.action == "replace" and f.path in manifest}
    return Plan(host.name, overlay, diff, findings, abi_mod.has_errors(findings), str(snap.id), base_version, facts, hashes)


def _stale(created: Any, max_age: float) -> bool:
    from datetime import datetime

    try:
        stamp = datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    return time.time() - stamp > max_age


def apply(host: Host, *, patchset: str | None = None, dry_run: bool = False, ignore_abi: bool = False,
          break_lock: bool = False, record_baseline: bool = True, progress: Progress = _quiet,
          command: str = "ddtree-deploy apply", force: bool = False, allow_base_drift: bool = False) -> ApplyReport:
    """The whole flow for one host. Raises DeployError (with its exit code) for refusals before any change:
    patch set missing or not applying (2/5), ABI errors (4), host unreachable (3), lock held, base drift or push
    failed (1)."""
    if not dry_run:
        require_server(host)  # a host we could not restart is refused before anything else happens
    t = time.monotonic()
    p = plan(host, patchset=patchset, progress=progress)
    plan_s = time.monotonic() - t
    details = {"patchset": p.overlay.patchset, "patchset_version": p.overlay.patchset_version,
               "base_version": p.base_version, "snapshot": p.snapshot_id, "abi": p.abi_dicts(), "files": len(p.overlay.files)}
    if dry_run:
        summary = dryrun.apply_summary(host, p.overlay, p.diff, record_baseline=record_baseline, force=force)
        return ApplyReport(host.name, "dry-run", message=f"would push {len(p.overlay.files)} files "
                           f"({p.overlay.patchset} {p.overlay.patchset_version} on sglang {p.base_version}); "
                           f"ABI: {'ERRORS' if p.abi_errors else 'ok'}", timings={"plan": plan_s},
                           details={**details, "diff": p.diff, "abi_errors": p.abi_errors, "summary": summary})
    if p.abi_errors and not ignore_abi:
        errors = [f"{d.get('rule')}: {d.get('what')} (fix: {d.get('fix')})" for d in p.abi_dicts() if d.get("severity") == "error"]
        raise AbiIncompatible(f"host {host.name}: ABI check failed; nothing was pushed\n  " + "\n  ".join(errors),
                              hint="fix the host or rebuild for it; --ignore-abi pushes anyway (dangerous)")
    if p.abi_errors:
        progress(f"[bold red]{host.name}: WARNING: pushing despite ABI errors (--ignore-abi)[/bold red]")
    report = deploy_overlay(host, p.overlay, break_lock=break_lock, command=command, record_baseline=record_baseline,
                            facts=p.facts, progress=progress, force=force, base_hashes=p.base_hashes,
                            allow_base_drift=allow_base_drift,
                            extra_meta={"abi_ignored": bool(p.abi_errors and ignore_abi), "snapshot": p.snapshot_id})
    report.timings = {"plan": plan_s, **report.timings}
    report.details.update(details)
    if report.probe and report.probe.ddtree:
        report.details["ddtree"] = describe_ddtree(report.probe.ddtree)
    return report


from .hostops import probe, releases, rollback  # noqa: E402  (the hand-driven commands, kept importable from here)

__all__ = ["ApplyReport", "Plan", "apply", "deploy_overlay", "plan", "probe", "releases", "rollback"]
