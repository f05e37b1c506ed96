"""The hand-driven commands on one host: ``rollback``, ``probe`` (and ``--record-baseline``), ``releases`` and the
server's ``start | stop | restart``. Each write takes the host lock (``transaction.run_on_host``), so none of them
can interleave with an apply (a ``server stop`` during an apply's probe is refused, not a false rollback), and
each first settles a switch that a vanished run left pending. Each write has a dry run that says what it would do.
"""

from __future__ import annotations

from typing import Any

from . import live
from .errors import EXIT_FAILED, InputError
from .inventory import Host, server_setting
from .baseline import record_baseline
from .hoststate import HostLayout, ReleaseState
from .probe import Prober, ProbeResult
from .release import ReleaseManager
from .server import ServerControl, require_server, server_spec
from .transaction import ApplyReport, Progress, quiet, run_on_host
from .transport import HostConnection


# -- rollback --------------------------------------------------------------------------------------------------------------
def _rollback_target(host: Host, state: ReleaseState, *, to: str | None, to_installed: bool, force: bool) -> str | None:
    active = state.active
    if to_installed:
        target = None
    elif to is not None:
        rel = state.release(to)
        if rel is None:
            raise InputError(f"host {host.name}: no release {to!r} (have: {', '.join(state.ids) or 'none'})")
        target = to
        if state.is_bad(to) and not force:
            note = f" ({rel['note']})" if rel.get("note") else ""
            raise InputError(f"host {host.name}: release {to} is marked {rel.get('status') or 'bad'}{note}; refusing to "
                             "roll back to it", hint="--force rolls back to it anyway")
    else:
        if active is None:
            raise InputError(f"host {host.name}: no overlay is active; nothing to roll back")
        target = state.rollback_target(active)
    if target == active:
        raise InputError(f"host {host.name}: {target or 'the installed package'} is already active")
    return target


def rollback(host: Host, *, to: str | None = None, to_installed: bool = False, break_lock: bool = False,
             force: bool = False, dry_run: bool = False, progress: Progress = quiet) -> ApplyReport:
    """Switch back by hand: to ``to``, to the installed package, or to the recorded rollback target of the active
    release; mark the release we leave bad, restart, and probe. A release marked bad is refused unless ``force``."""
    require_server(host)
    if dry_run:
        with HostConnection(host) as conn:
            state = ReleaseManager(conn).state()
            target = _rollback_target(host, state, to=to, to_installed=to_installed, force=force)
            ctl = ServerControl(conn)
            active = state.active
            lines = [f"switch current from {active or 'the installed package'} to {target or 'the installed package'}",
                     f"mark {active} bad" if active else "nothing to mark",
                     ctl.describe("restart", release=target, ddtree=target is not None),
                     "probe it (overlay, selftest, startup, generation)"]
        return ApplyReport(host.name, "dry-run", release=target, previous=active, rolled_back_to=target,
                           message="would " + "; ".join(lines), details={"summary": lines})
    with run_on_host(host, "ddtree-deploy rollback", break_lock=break_lock, progress=progress) as run:
        # the target is chosen only now, after settling a run that was still under way (an apply probing a release
        # when --break-lock took its lock over): that settle already rolled the unprobed release back
        state = run.state
        active = state.active
        settled = run.settled_outcome or {}
        undone = settled.get("action") == "rolled-back" and settled.get("release") != active
        if undone and to is None and not to_installed:
            # what was asked for is done: the release being probed is out, the last good one back and serving
            target, left = active, settled.get("release")
        else:
            target = _rollback_target(host, state, to=to, to_installed=to_installed, force=force)
            # the release the settle put back passed its probe: leaving it now is no verdict on it
            run.mgr.roll_back(target, failed=None if undone else active, note="rolled back by hand",
                              spec=server_spec(host), timeout=float(server_setting(host, "stop_timeout")) + 90)
            left = active
        report = ApplyReport(host.name, "ok", release=target, previous=left, rolled_back_to=target,
                             details={"reconciled": run.settled} if run.settled else {})
        run.mgr.stage = "probe after rollback"
        report.probe = run.prober.run(target, label="after rollback")
        if report.probe.ok:
            how = " (by settling the run that was probing it)" if target == active else ""
            report.message = f"rolled back from {left or 'the installed package'} to {target or 'the installed package'}{how}"
        else:
            report.status = "rollback-failed"
            report.exit_code = EXIT_FAILED
            report.message = f"ROLLED BACK TO {target or 'the installed package'} BUT ITS PROBE FAILED — the host needs attention"
        run.mgr.finish(target if report.probe.ok else None, "good" if report.probe.ok and target else None, "rollback",
                       **{"from": left, "to": target, "outcome": report.status, "forced": force or None})
        return report


# -- probe ---------------------------------------------------------------------------------------------------------------
def probe(host: Host, *, record: bool = False, record_with_ddtree: bool = False, dry_run: bool = False,
          progress: Progress = quiet) -> tuple[ProbeResult | None, dict | None]:
    """Probe the running server against the active release (optionally recording the baseline first).

    A read, unless it finds a release switched in but never probed with nobody holding the lock (its run vanished
    and the host could not settle it): then it takes the lock, probes that release and keeps it if it passes, or
    rolls it back, and says which. ``record`` takes the lock too (it restarts the server twice)."""
    require_server(host)
    if dry_run:
        if not record:
            raise InputError("probe only writes with --record-baseline; --dry-run needs it")
        with HostConnection(host) as conn:
            active = ReleaseManager(conn).state().active
            ctl = ServerControl(conn)
            lines = [ctl.describe("restart", release=active, ddtree=record_with_ddtree),
                     f"generate {len(host.probe.get('prompts') or [])} prompts at temperature 0 and write "
                     f"{HostLayout.of(host).baseline}",
                     ctl.describe("restart", release=active, ddtree=active is not None)]
        return None, {"dry_run": lines}
    if record:
        with run_on_host(host, "ddtree-deploy probe --record-baseline", progress=progress) as run:
            run.mgr.stage = "baseline"
            baseline = record_baseline(run.prober, run.ctl, ddtree=record_with_ddtree)
            active = run.mgr.state().active
            run.mgr.stage = "probe"
            return run.prober.run(active), baseline
    with HostConnection(host) as conn:
        info = ReleaseManager(conn).show()
    state = ReleaseState.of(info["state"])
    pending = state.pending
    if pending and info.get("lock_state") in ("free", "dead"):
        with run_on_host(host, "ddtree-deploy probe", progress=progress, probe_pending=True) as run:
            result = run.settled_probe or run.prober.run(run.state.active)
            result.label = f"probe ({run.settled})" if run.settled else result.label
            return result, None
    with HostConnection(host) as conn:
        if pending:
            progress(f"{host.name}: release {pending.get('release')} is being probed by run {pending.get('run')} right now")
        return Prober(conn, progress=progress).run(state.active), None


def flag_drift(conn: HostConnection, host: Host, active: str | None) -> list[str] | None:
    """How the running server's flags (its recorded launch line) differ from the host file's (decide.launch_drift):
    [] when they agree, None when the server runs nothing this tool started."""
    from .decide import launch_drift

    drift = launch_drift(host, ServerControl(conn).launch(), ddtree=active is not None)
    return None if drift is None else list(drift)


def server_flag_drift(host: Host) -> list[str] | None:
    """``flag_drift`` on a connection of its own (``probe`` warns with it before probing)."""
    require_server(host)
    with HostConnection(host) as conn:
        return flag_drift(conn, host, ReleaseManager(conn).state().active)


def releases(host: Host, journal_lines: int = 10, live_window: float = live.DEFAULT_WINDOW) -> dict[str, Any]:
    """The host's release state and journal, the server's flag drift and its live figures (``live``), on one
    connection."""
    with HostConnection(host) as conn:
        info = ReleaseManager(conn).show(journal_lines)
        if server_setting(host, "kind") != "none":
            info["flag_drift"] = flag_drift(conn, host, ReleaseState.of(info["state"]).active)
        info["live"] = live.read_on(conn, host, live_window)
        return info


# -- server --------------------------------------------------------------------------------------------------------------------
def server_action(host: Host, action: str, *, dry_run: bool = False, wait: bool = True, break_lock: bool = False,
                  progress: Progress = quiet) -> dict[str, Any]:
    """``start | stop | restart`` the host's server under the host lock, on the active release (DDTree flags on only
    when an overlay is active). After a start it waits for /health (the probe's start-up stage, no-progress rule
    included) unless ``wait`` is False, and fails when the server does not come up."""
    require_server(host)
    if dry_run:
        with HostConnection(host) as conn:
            active = ReleaseManager(conn).state().active
            text = ServerControl(conn).describe(action, release=active, ddtree=active is not None)
        return {"dry_run": True, "would": text, "active_release": active}
    with run_on_host(host, f"ddtree-deploy server {action}", break_lock=break_lock, progress=progress) as run:
        active = run.state.active
        run.mgr.stage = f"server {action}"
        if action == "stop":
            res = run.ctl.stop()
        else:
            res = getattr(run.ctl, action)(release=active, ddtree=active is not None)
        res = {"action": action, "active_release": active, **res}
        if run.settled:
            res["reconciled"] = run.settled
        if action != "stop" and wait:
            stage = run.prober.startup(active)
            res["startup"] = {"status": stage.status, "detail": stage.detail, "seconds": round(stage.seconds, 3)}
            if stage.status == "fail":
                res["log_tail"] = stage.log_tail or run.prober.log_tail()
        return res


__all__ = ["flag_drift", "probe", "releases", "rollback", "server_action", "server_flag_drift"]
