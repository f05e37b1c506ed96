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

What happens is decided once (``decide.decide``: a list of steps from the host's release state, the server's
launch line and the overlay) and executed step by step here; ``apply --dry-run`` prints the same list and writes
nothing. Re-applying the overlay that is already active, with the server running the host file's flags and passing
its probe, changes nothing ("unchanged": no release, no restart); flags that changed restart the same release;
``force`` redoes it as a new release.
"""

from __future__ import annotations

import time
from typing import Any

from . import baseline as baseline_mod
from .decide import Decision, Observed, Step, decide, redecide_after_failed_probe
from .errors import AbiIncompatible, DeployError, EXIT_FAILED, InputError, is_cut
from .inventory import Host, server_setting
from .overlay import Overlay
from .ddtree_stats import describe_ddtree
from .plan import DEFAULT_PATCHSET, Plan, dry_run_decision, plan
from .probe import ProbeResult, Stage
from .release import PushResult
from .server import require_server, server_spec
from .transaction import ApplyReport, Progress, Run, quiet, run_on_host
from .hostfile import write_host_file
from .launch_check import check_launch_line, plan_flag_fix

_quiet = quiet


# -- from the lock on ------------------------------------------------------------------------------------------------------
def observe(run: Run) -> Observed:
    """What ``decide`` needs, read under the run's lock: the release state, the server's launch, the baseline."""
    return Observed(run.state, run.ctl.launch(), bool(run.lock_info.get("has_baseline")))


def deploy_overlay(host: Host, overlay: Overlay, *, break_lock: bool = False, command: str = "ddtree-deploy apply",
                   record_baseline: bool = True, facts: dict[str, Any] | None = None, extra_meta: dict[str, Any] | None = None,
                   progress: Progress = _quiet, run_id: str | None = None, force: bool = False,
                   base_hashes: dict[str, str] | None = None, allow_base_drift: bool = False) -> ApplyReport:
    """Lock the host, decide (``decide.decide``) and execute the steps: push ``overlay`` as a new release, switch,
    restart, probe, roll back when the probe fails; or restart on the same release when only the server's flags
    changed; or nothing when the active release holds the overlay, runs the host file's flags and passes its probe.

    Raises DeployError only for failures before anything was switched (lock held, push failed, base drift, host
    unreachable) and for interruptions (Interrupted, ConnectionCut: their message says how the host settled the
    run). Everything after the switch is reported in the ApplyReport.
    """
    require_server(host)
    t = time.monotonic()
    with run_on_host(host, command, break_lock=break_lock, progress=progress, facts=facts, run_id=run_id) as run:
        ex = _Executor(run, overlay, progress, extra_meta=extra_meta, base_hashes=base_hashes,
                       allow_base_drift=allow_base_drift, record_baseline=record_baseline)
        ex.timings["lock"] = time.monotonic() - t
        if run.settled:
            ex.details["reconciled"] = run.settled
        return ex.execute(decide(observe(run), overlay, host, force=force, record_baseline=record_baseline))


class _Executor:
    """Runs a Decision's steps in order on a locked host; the report says what happened."""

    def __init__(self, run: Run, overlay: Overlay, progress: Progress, *, extra_meta: dict[str, Any] | None,
                 base_hashes: dict[str, str] | None, allow_base_drift: bool, record_baseline: bool) -> None:
        self.run, self.overlay, self.progress = run, overlay, progress
        self.host = run.host
        self.extra_meta, self.base_hashes, self.allow_base_drift = extra_meta, base_hashes, allow_base_drift
        self.record_baseline = record_baseline
        self.previous = run.state.active
        self.timings: dict[str, float] = {}
        self.details: dict[str, Any] = {}
        self.release: str | None = self.previous
        self.pushed: PushResult | None = None
        self.checked: list[Stage] = []
        self.failure: ProbeResult | None = None
        self.probe: ProbeResult | None = None
        self.restarted = False  # whether the server ran (or may have run) the new release: a rollback restarts it
        self.t_probe = 0.0

    def execute(self, decision: Decision) -> ApplyReport:
        self.details["decision"] = decision.to_dict()
        self.progress(f"{self.host.name}: {decision.summary}")
        for step in decision.steps:
            done = getattr(self, "_" + step.action)(step)
            if done is not None:
                return done
        raise AssertionError(f"decision without a final probe: {decision}")  # decide() always ends with one

    def _settle(self, step: Step) -> None:
        return None  # run_on_host settled it when it took the lock

    def _baseline(self, step: Step) -> None:
        self.progress(f"{self.host.name}: no generation baseline yet: recording one with DDTree off")
        t = time.monotonic()
        self.run.mgr.stage = "baseline"
        baseline_mod.record_baseline(self.run.prober, self.run.ctl, ddtree=False)
        self.timings["baseline"] = time.monotonic() - t

    def _push(self, step: Step) -> None:
        self.progress(f"{self.host.name}: pushing {len(self.overlay.files)} overlay files")
        t = time.monotonic()
        pushed = self.run.mgr.push(self.overlay, extra_meta=self.extra_meta, base_hashes=self.base_hashes,
                                   allow_base_drift=self.allow_base_drift)
        if pushed.base_drift:
            self.details["base_drift"] = pushed.base_drift
            self.progress(f"[bold red]{self.host.name}: WARNING: pushed despite base drift (--allow-base-drift): "
                          f"{'; '.join(pushed.base_drift[:3])}[/bold red]")
        self.pushed, self.release = pushed, pushed.release_id
        self.timings["push_switch"] = time.monotonic() - t

    def _switch(self, step: Step) -> None:
        t = time.monotonic()
        try:  # before the switch: a line the release's SGLang refuses would not start
            self.details["launch_line"] = check_launch_line(self.run.conn, self.host, self.release)
        except InputError as exc:
            if self.pushed is None:
                raise
            removed = self.run.mgr.discard_release(self.release, why="launch line refused: " + exc.message[:300])
            raise InputError(exc.message + (f"; release {self.release} was removed from the host" if removed else ""),
                             hint=exc.hint) from None
        self.run.mgr.switch(self.release, probing=True)
        self.timings["push_switch"] = self.timings.get("push_switch", 0.0) + time.monotonic() - t
        self.progress(f"{self.host.name}: switched current → {self.release}; probing")

    def _guarded(self, action: Any) -> None:
        """A failure of a check or restart is a failed probe (still reported, still rolled back), never a crash."""
        try:
            action()
        except DeployError as exc:
            if is_cut(exc):
                raise  # the connection is gone or the host gave the run up: the host settles it (release.Lease)
            self.failure = ProbeResult(self.host.name, self.release,
                                       [Stage("probe", "fail", time.monotonic() - self.t_probe, str(exc))])
            self.restarted = True

    def _check(self, step: Step) -> None:
        self.t_probe = time.monotonic()
        self.run.mgr.stage = "probe"

        def check() -> None:
            self.checked = self.run.prober.check_release(self.release)
        self._guarded(check)

    def _restart(self, step: Step) -> None:
        if self.failure or any(s.status == "fail" for s in self.checked):
            return
        if step.data.get("flag_diff"):
            self.details["flag_diff"] = step.data["flag_diff"]
            self.progress(f"{self.host.name}: the server's flags differ from the host file: "
                          + "; ".join(step.data["flag_diff"]))
        self.progress(f"{self.host.name}: restarting the server on {self.release}")

        def restart() -> None:
            self.run.mgr.stage = "restart"
            self.restarted = True
            self.run.ctl.restart(release=self.release, ddtree=True)
            self.run.mgr.stage = "probe"
        self._guarded(restart)

    def _probe(self, step: Step) -> ApplyReport:
        if step.data.get("unchanged"):
            return self._probe_unchanged(step)
        if self.failure is None:
            def serving() -> None:
                self.probe = self.run.prober.check_serving(self.release, self.checked, label="probe")
            self._guarded(serving)
        probe = self.failure or self.probe
        self.timings["probe"] = time.monotonic() - self.t_probe
        report = self._report(probe)
        mgr = self.run.mgr
        if probe.ok:
            mgr.stage = "finish"
            if self.pushed is None:  # the flags changed: the same release, restarted
                mgr.finish(None, None, "apply", release=self.release, outcome="restarted",
                           flag_diff=self.details.get("flag_diff"), ddtree=probe.ddtree or None)
                report.message = (f"release {self.release} restarted with the host file's flags and healthy ("
                                  + "; ".join(self.details.get("flag_diff") or []) + ")")
                return report
            report.details["removed_releases"] = mgr.finish(self.release, "good", "apply", release=self.release,
                                                            outcome="ok", previous=self.previous,
                                                            ddtree=probe.ddtree or None)
            report.message = f"release {self.release} active and healthy"
            return report
        stage = probe.failed_stage
        why = f"probe stage {stage.name} failed: {stage.detail}" if stage else "probe failed"
        if not step.data.get("rollback", True):
            mgr.stage = "finish"
            mgr.finish(None, None, "apply", release=self.release, outcome="failed", why=why[:500],
                       flag_diff=self.details.get("flag_diff"))
            report.status, report.exit_code = "failed", EXIT_FAILED
            report.message = (f"{why}; the server runs release {self.release} with the host file's new flags and fails "
                              "its probe (the release is the same, so there is nothing to roll back to): fix the "
                              "host file's server flags and apply again")
            return report
        t = time.monotonic()
        _roll_back(self.run, report, failed=self.release, why=why, server_ran_failed=self.restarted,
                   progress=self.progress)
        self.timings["rollback"] = time.monotonic() - t
        return report

    def _report(self, probe: ProbeResult | None) -> ApplyReport:
        push = None
        if self.pushed is not None:
            p = self.pushed
            push = {"release": p.release_id, "seconds": round(p.seconds, 3), "link_mode": p.link_mode, "files": p.files,
                    "bytes": p.bytes_sent}
        return ApplyReport(self.host.name, "ok", release=self.release, previous=self.previous, push=push, probe=probe,
                           timings=self.timings, details=self.details)

    def _probe_unchanged(self, step: Step) -> ApplyReport:
        """The active release holds this overlay and runs the host file's flags: probe it as it runs; when it
        passes nothing else happens, when it fails it is deployed again as a new release."""
        run, active = self.run, step.data["release"]
        run.mgr.stage = "probe"
        self.progress(f"{self.host.name}: release {active} already holds this overlay; probing it as it runs")
        probe = run.prober.run(active, label="probe (unchanged)")
        if not probe.ok:
            stage = probe.failed_stage
            why = (f"release {active} holds this overlay but fails its probe "
                   f"({stage.name if stage else '?'}: {stage.detail if stage else '?'}); deploying it again")
            self.progress(f"{self.host.name}: {why}")
            return self.execute(redecide_after_failed_probe(observe(run), self.overlay, self.host,
                                                            record_baseline=self.record_baseline, why=why))
        run.mgr.finish(None, None, "apply", release=active, outcome="unchanged")
        return ApplyReport(self.host.name, "unchanged", release=active, previous=active, probe=probe,
                           timings=self.timings, details=self.details,
                           message=f"release {active} already holds this overlay and passes its probe: unchanged "
                                   "(no new release, no restart; --force redoes it)")


def _roll_back(run: Run, report: ApplyReport, *, failed: str, why: str, server_ran_failed: bool,
               progress: Progress = _quiet) -> None:
    """Switch back to the previous good release, mark ``failed`` bad, restart if needed, re-probe; fill ``report``."""
    mgr, ctl, host = run.mgr, run.ctl, run.host
    target = mgr.state().rollback_target(failed)
    # restart only if the server ran (or tried to run) the failed release, or is not running at all
    needs_restart = server_ran_failed or not ctl.status().get("running")
    mgr.roll_back(target, failed=failed, note=why[:500], spec=server_spec(host) if needs_restart else None,
                  timeout=float(server_setting(host, "stop_timeout")) + 90)
    report.rolled_back_to = target
    where = f"release {target}" if target else "the installed package (no overlay)"
    # said once the host did it (this run still held the lock): a run the host gave up never prints it
    progress(f"{host.name}: {why}; rolled back to {where}; probing it")
    mgr.stage = "probe after rollback"
    second = run.prober.run(target, label="after rollback")
    report.rollback_probe = second
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


# -- the whole flow (the plan: plan.py) --------------------------------------------------------------------------------------
def _fix_flags(host: Host, version: str | None, *, dry_run: bool, progress: Progress) -> tuple[Host, dict[str, Any]]:
    """``--fix-flags``: the host file's removed flags renamed (written unless ``dry_run``); the host to go on with."""
    if version is None:  # only a dry run on a host with no snapshot gets here (apply takes one first)
        return host, {"renames": [], "why": "the host's SGLang version is not known before a snapshot is taken"}
    fix = plan_flag_fix(host, version)
    if fix is None:
        return host, {"renames": [], "why": f"no flag in the host file that SGLang {version} removed"}
    if dry_run:
        return fix.host, {**fix.to_dict(), "written": False}
    new_host = write_host_file(host, fix.new_text)
    progress(f"{host.name}: {host.source}: renamed " + ", ".join(fix.renames) + f" (SGLang {version})")
    return new_host, {**fix.to_dict(), "written": True}


def apply(host: Host, *, patchset: str | None = None, dry_run: bool = False, ignore_abi: bool = False,
          break_lock: bool = False, record_baseline: bool = True, progress: Progress = _quiet,
          command: str = "ddtree-deploy apply", force: bool = False, allow_base_drift: bool = False,
          fix_flags: bool = False) -> ApplyReport:
    """The whole flow for one host. Raises DeployError (with its exit code) for refusals before any change:
    patch set missing or not applying (2/5), ABI errors (4), host unreachable (3), lock held, base drift or push
    failed (1). ``fix_flags``: first write the new spelling of the flags the host's SGLang removed into the host file
    (launch_check.plan_flag_fix; with ``dry_run`` the edit is shown and the steps are those of the edited file)."""
    if not dry_run:
        require_server(host)  # a host we could not restart is refused before anything else happens
    t = time.monotonic()
    p = plan(host, patchset=patchset, progress=progress, dry_run=dry_run, allow_base_drift=allow_base_drift)
    plan_s = time.monotonic() - t
    details: dict[str, Any] = {"patchset": p.overlay.patchset if p.overlay else patchset or DEFAULT_PATCHSET,
                               "patchset_version": p.overlay.patchset_version if p.overlay else None,
                               "base_version": p.base_version, "snapshot": p.snapshot_id, "abi": p.abi_dicts(),
                               "files": len(p.overlay.files) if p.overlay else None}
    if fix_flags:
        host, details["fix_flags"] = _fix_flags(host, p.base_version, dry_run=dry_run, progress=progress)
    if dry_run:
        decision = dry_run_decision(host, p, record_baseline=record_baseline, force=force)
        stats = p.stats()
        summary = {"files": stats, "added": sum(f["added"] for f in stats), "removed": sum(f["removed"] for f in stats),
                   **decision.to_dict()}
        what = (f" ({p.overlay.patchset} {p.overlay.patchset_version} on sglang {p.base_version}; "
                f"ABI: {'ERRORS' if p.abi_errors else 'ok'})") if p.overlay else " (the ABI is checked against it too)"
        return ApplyReport(host.name, "dry-run", message=decision.summary + what, timings={"plan": plan_s},
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
