"""CLI: ``apply``, ``probe``, ``rollback`` and ``releases`` (the server commands: ``commands/server.py``).

Every command that changes a host takes the host lock and has ``--dry-run`` (a summary of what it would do; the
full overlay diff only with ``--diff``). Ctrl-C or SIGTERM during one is not a silent exit: the host settles the
run (anything switched in but not probed is rolled back) and the command says so and exits 130.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .. import deploy as deploy_mod
from .. import hostops, live as live_mod
from ..console import emit_json, err, out, table
from ..deploy import ApplyReport
from .. import paths
from ..dryrun import summary_lines
from ..errors import EXIT_FAILED, EXIT_USAGE, InputError, OperationFailed
from ..hoststate import ReleaseState
from ..fleet import read_retry_file, rollout, write_retry_file
from ..inventory import Host
from ..ddtree_stats import describe_ddtree
from ..probe import ProbeResult
from ._writes import interruptible as _interruptible
from ._writes import progress as _progress
from ._options import (AllHostsOpt, BreakLockOpt, DryRunOpt, HostArg, HostOpt, HostsArg, HostsOpt, InventoryOpt, JsonOpt,
                       LimitOpt, many_hosts, one_host)



LiveWindowOpt = typer.Option(
    live_mod.DEFAULT_WINDOW, "--live-window", min=0.0, max=600.0, envvar="DDTREE_LIVE_WINDOW", help="seconds between the two reads of the server's DDTree "
    "counters (/metrics, read on the host) that give the live columns: accept length = 1 + accepted draft tokens / "
    "drafts over those seconds; decode tok/s = tokens the verify rounds committed per second over them (drafts + "
    "accepted draft tokens; prefill's first token not counted); 'idle' when the server decoded nothing then (the "
    "accept length is then the one since the server started); '-' with the reason when the server is down or "
    "serves no DDTree counters; 0 skips the read")

EngineOpt = typer.Option("builtin", "--engine", help="builtin (this tool's own SSH and thread pool) or ansible (the "
                         "ddtree.deploy collection through ansible-runner: needs the [ansible] extra)")


def _engine(engine: str) -> str:
    if engine not in ("builtin", "ansible"):
        raise InputError(f"--engine: {engine!r} is not one of builtin, ansible")
    return engine


# -- rendering -----------------------------------------------------------------------------------------------------------
def print_probe(result: ProbeResult) -> None:
    mark = {"pass": "[green]pass[/green]", "fail": "[bold red]FAIL[/bold red]", "skip": "[yellow]skip[/yellow]",
            "not-run": "[dim]not run[/dim]"}
    t = table(f"{result.host}: {result.label} (release {result.release or 'none: installed package'})",
              ["stage", "result", "seconds", "detail"], [])
    for s in result.stages:
        t.add_row(s.name, mark.get(s.status, s.status), f"{s.seconds:.2f}", s.detail)
    out.print(t)
    if result.ddtree:
        out.print(f"[bold]DDTree[/bold]: {describe_ddtree(result.ddtree)}", highlight=False)
    failed = result.failed_stage
    if failed and failed.log_tail:
        out.print(f"[bold]log tail ({failed.name}):[/bold]")
        out.print(failed.log_tail, markup=False, highlight=False)


def print_live(host: str, live: dict[str, Any]) -> None:
    """The live table: the server's mean acceptance length and decode tok/s now (``live.read_live``)."""
    out.print(table(f"{host}: live (the server's DDTree counters)",
                    ["accept length", "decode tok/s", "over"], [live_mod.cells(live)]))


def print_report(report: ApplyReport, *, show_diff: bool = False) -> None:
    if report.details.get("reconciled"):
        err.print(f"[bold yellow]{report.host}: {report.details['reconciled']}[/bold yellow]", highlight=False)
    if report.status == "dry-run":
        summary = report.details.get("summary")
        fix = report.details.get("fix_flags")
        if fix and fix.get("diff"):
            out.print(f"[bold]{report.host}: --fix-flags would edit {fix['file']}[/bold] ({', '.join(fix['renames'])})",
                      highlight=False)
            out.print(fix["diff"].rstrip("\n"), markup=False, highlight=False)
        elif fix:
            out.print(f"{report.host}: --fix-flags: nothing to rename ({fix.get('why')})", highlight=False)
        # the overlay's files and diff matter only when a new release would be pushed
        pushes = not isinstance(summary, dict) or any(s["action"] == "push" for s in summary["steps"])
        if isinstance(summary, dict):
            if pushes and summary["files"]:
                out.print(f"[bold]{report.host}: the overlay against the installed package[/bold]")
                out.print("\n".join(summary_lines(summary["files"])), markup=False, highlight=False)
            if summary.get("flag_diff"):
                out.print(f"[bold]{report.host}: server flags (running → host file)[/bold]")
                out.print("\n".join(f"  {line}" for line in summary["flag_diff"]), markup=False, highlight=False)
            out.print(f"[bold]{report.host}: steps[/bold]")
            for i, step in enumerate(summary["steps"], 1):
                out.print(f"  {i}. [{step['action']}] {step['text']}", markup=False, highlight=False)
        elif isinstance(summary, list):
            for i, step in enumerate(summary, 1):
                out.print(f"  {i}. {step}", markup=False, highlight=False)
        if pushes and show_diff and report.details.get("diff"):
            out.print(report.details["diff"], markup=False, highlight=False)
        elif pushes and report.details.get("diff"):
            out.print("[dim](the full diff: --diff)[/dim]")
        if "abi" in report.details and report.details.get("snapshot"):  # no snapshot yet: nothing was checked
            from .. import abi

            findings = [abi.Finding(**d) for d in report.details.get("abi", [])]
            out.print(abi.render(findings) if findings else "ABI: no findings")
        out.print(f"dry run: {report.message}; nothing was touched", highlight=False)
        return
    if report.probe:
        print_probe(report.probe)
    if report.rollback_probe:
        print_probe(report.rollback_probe)
    if report.details.get("flag_diff"):
        err.print(f"[bold yellow]{report.host}: restarted because the server's flags differed from the host file:"
                  "[/bold yellow] " + "; ".join(report.details["flag_diff"]), highlight=False)
    if report.details.get("base_drift"):
        err.print(f"[bold red]{report.host}: pushed with base drift (--allow-base-drift):[/bold red] "
                  + "; ".join(report.details["base_drift"]), highlight=False)
    style = "green" if report.ok else "bold red"
    out.print(f"[{style}]{report.host}: {report.status}[/{style}]: {report.message}", highlight=False)


def warn_flag_drift(host: str, drift: list[str]) -> None:
    """The running server was started with other flags than the host file gives now (``apply`` restarts it)."""
    err.print(f"[bold yellow]{host}: WARNING: the running server's flags differ from the host file "
              f"(running → host file: {'; '.join(drift)}); `ddtree-deploy apply --host {host}` restarts it with the "
              "host file's[/bold yellow]", highlight=False)


def print_recap(reports: list[ApplyReport], skipped: list[str], unusable: dict[str, str] | None = None) -> None:
    rows = []
    for r in reports:
        stage = r.probe.failed_stage.name if r.probe and r.probe.failed_stage else ""
        back = ""
        if r.went_back:
            back = r.rolled_back_to or "installed package"
        rows.append([r.host, r.status, r.release or "", back, stage,
                     f"{sum(r.timings.values()):.1f}", r.message])
    rows += [[name, "skipped", "", "", "", "", "not started"] for name in skipped]
    rows += [[name, "unusable", "", "", "", "", f"bad host file: {why}"] for name, why in (unusable or {}).items()]
    out.print(table("recap", ["host", "status", "release", "rolled back to", "failed stage", "seconds", "message"], rows))


def _select_hosts(names: list[list[str]] | None, opts: list[list[str]] | None, limit: list[list[str]] | None,
                  all_hosts: bool, retry_failed: bool, retry_file: Path,
                  inventory: Path | None) -> tuple[list[Host], dict[str, str]]:
    """The hosts to deploy to, and the unusable ones a pattern took in, which are reported, not deployed."""
    if sum(bool(x) for x in (names or opts, all_hosts, retry_failed)) > 1:
        raise InputError("choose the hosts with one of: HOST / --host PATTERN (repeatable), --all, or --retry-failed "
                         "(--limit narrows any of them)")
    if retry_failed:
        names, opts = [read_retry_file(retry_file)], None
    selected, unusable = many_hosts(names, opts, limit, all_hosts, inventory)
    if not selected:
        raise InputError("no usable host in the inventory" + (f" ({len(unusable)} bad host file(s))" if unusable else ""),
                         hint="`ddtree-deploy hosts list` shows the inventory and what is wrong with it")
    return selected, unusable


# -- commands ------------------------------------------------------------------------------------------------------------
def apply_cmd(
    names: Optional[list[str]] = HostsArg,
    hosts: Optional[list[str]] = HostsOpt,
    limit: Optional[list[str]] = LimitOpt,
    all_hosts: bool = AllHostsOpt,
    retry_failed: bool = typer.Option(False, "--retry-failed", help="the hosts listed in the retry file of the last apply"),
    retry_file: Optional[Path] = typer.Option(None, "--retry-file", help="where failed hosts are written / read (default: "
                                              "ddtree-deploy.retry in the checkout, else ~/.local/state/ddtree-deploy/last-apply.retry)"),
    patchset: Optional[str] = typer.Option(None, "--patchset", help="patch set name (default: the one for the host's sglang version)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would change (files, +/- lines, what would restart) "
                                 "and the ABI verdict; touch nothing"),
    diff: bool = typer.Option(False, "--diff", help="with --dry-run: also print the full overlay diff"),
    force: bool = typer.Option(False, "--force", help="deploy even when the active release already holds this overlay "
                               "and passes its probe (a new release and a restart)"),
    allow_base_drift: bool = typer.Option(False, "--allow-base-drift", help="build even if the installed files the overlay "
                                          "replaces changed since the snapshot (LOUD: the host's changes are not in the release)"),
    ignore_abi: bool = typer.Option(False, "--ignore-abi", help="push despite ABI errors (loud; for experts)"),
    break_lock: bool = BreakLockOpt,
    max_parallel: int = typer.Option(4, "--max-parallel", min=1, help="hosts deployed at once after the canary"),
    max_fail: int = typer.Option(0, "--max-fail", min=0, help="stop starting new hosts once more than this many failed"),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="do not record a generation baseline on hosts lacking one"),
    fix_flags: bool = typer.Option(False, "--fix-flags", help="first rewrite flags the host's SGLang removed (e.g. "
                                   "--mamba-scheduler-strategy, gone in 0.5.20) to their new spelling in the host file's "
                                   "server.command / server.ddtree_flags; with --dry-run: show that edit, write nothing"),
    engine: str = EngineOpt,
    serial: Optional[str] = typer.Option(None, "--serial", help="--engine ansible: Ansible's serial, host counts or "
                                         "percentages (1,50%: a canary, then half the hosts at a time; default "
                                         "1,<--max-parallel>)"),
    max_fail_percentage: int = typer.Option(0, "--max-fail-percentage", min=0, max=100, help="--engine ansible: stop "
                                            "after a batch in which more than this share of hosts failed"),
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Deploy the DDTree overlay: patch set → ABI check → lock → push → switch → restart → probe → roll back on failure.

    Hosts: HOST..., -H PATTERN (a,b / 'gpu*' / a group), --all, or --retry-failed; --limit narrows them.

    Several hosts: the first is the canary; the rest follow in parallel (--max-parallel) until more than --max-fail
    have failed. A host with no generation baseline gets one first (server restarted with DDTree off, the fixed
    prompts recorded in <release_root>/probe-baseline.json). A host whose active release already holds the overlay
    and passes its probe is left alone ("unchanged"). Ctrl-C at any point: the host rolls back whatever was not yet
    probed, and the command says so (exit 130). Exit 0 all healthy or unchanged, 1 a probe failed (rolled back),
    2 bad input, 3 unreachable or cut, 4 ABI, 5 patch.
    """
    if diff and not dry_run:
        raise InputError("--diff goes with --dry-run (it prints the overlay diff instead of deploying)")
    retry_file = retry_file or paths.retry_file()
    _engine(engine)
    if engine == "builtin" and (serial is not None or max_fail_percentage):
        raise InputError("--serial and --max-fail-percentage go with --engine ansible (the builtin engine: "
                         "--max-parallel, --max-fail)")
    if engine == "ansible" and fix_flags:
        raise InputError("--fix-flags is not available with --engine ansible yet: run it with the builtin engine first")
    selected, unusable = _select_hosts(names, hosts, limit, all_hosts, retry_failed, retry_file, inventory)

    def action(host: Host) -> ApplyReport:
        return deploy_mod.apply(host, patchset=patchset, dry_run=dry_run, ignore_abi=ignore_abi, break_lock=break_lock,
                                record_baseline=not no_baseline, progress=_progress, force=force,
                                allow_base_drift=allow_base_drift, fix_flags=fix_flags)

    with _interruptible():
        if engine == "ansible":
            from ..ansible import bundle, engine as ansible_engine

            def prepare(host: Host, directory: Path) -> Path:
                return bundle.prepare(host, directory, patchset=patchset, ignore_abi=ignore_abi, dry_run=dry_run,
                                      allow_base_drift=allow_base_drift, force=force, record_baseline=not no_baseline,
                                      break_lock=break_lock, progress=_progress)
            result = ansible_engine.apply(selected, prepare, serial=ansible_engine.parse_serial(serial or f"1,{max_parallel}"),
                                          max_fail_percentage=max_fail_percentage, dry_run=dry_run, forks=max_parallel,
                                          force=force, break_lock=break_lock, progress=_progress)
        elif len(selected) == 1 and not retry_failed and not unusable:
            report = action(selected[0])  # a refusal raises with its own exit code
            if as_json:
                emit_json(report.to_dict())
            else:
                print_report(report, show_diff=diff)  # its probe table ends with the one DDTree line
            raise typer.Exit(report.exit_code)
        else:
            result = rollout(selected, action, max_parallel=max_parallel, max_fail=max_fail, progress=_progress)
    if not dry_run:
        retry_file.parent.mkdir(parents=True, exist_ok=True)
    path = None if dry_run else write_retry_file(result, retry_file)
    code = max(result.exit_code, EXIT_USAGE if unusable else 0)
    if as_json:
        emit_json({**result.to_dict(), "ok": code == 0, "exit_code": code, "unusable": unusable,
                   "retry_file": str(path) if path else None})
    else:
        for r in result.reports:
            if not r.ok or r.status == "dry-run":
                print_report(r, show_diff=diff)
        print_recap(result.reports, result.skipped, unusable)
        if result.aborted:
            err.print(f"[bold red]{result.aborted}[/bold red]")
        if path:
            err.print(f"failed hosts written to {path}; rerun with --retry-failed")
    raise typer.Exit(code)


def probe_cmd(
    host: Optional[str] = HostArg,
    host_opt: Optional[str] = HostOpt,
    record_baseline: bool = typer.Option(False, "--record-baseline", help="restart with DDTree off, record the fixed prompts' "
                                         "replies as the baseline on the host, restart as configured, then probe"),
    with_ddtree: bool = typer.Option(False, "--with-ddtree", help="record the baseline with DDTree on instead"),
    dry_run: bool = typer.Option(False, "--dry-run", help="with --record-baseline: say what it would restart and write"),
    live_window: float = LiveWindowOpt,
    engine: str = EngineOpt,
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Probe a host's running server: overlay in use, kernel self-test, start-up/health, generation vs baseline; then
    what DDTree does there (budget, accept length, tok/s of the probe's own requests), and live, from the server's
    DDTree counters after the probe: its accept length and decode tok/s over the last --live-window seconds ("idle"
    when it decoded nothing then; "-" and the reason when it is down). A release left switched in but unprobed by
    a run that vanished is probed and kept if it passes, else rolled back (said either way)."""
    h = one_host(host, host_opt, inventory)
    if _engine(engine) == "ansible":
        if record_baseline:
            raise InputError("--record-baseline is not available with --engine ansible: use the builtin engine")
        from ..ansible import engine as ansible_engine

        with _interruptible():
            res = ansible_engine.one_host(h, "ddtree_probe", {"live_window": live_window}, progress=_progress)
        result = ansible_engine.probe_result(res.get("probe"))
        if result is None:
            raise OperationFailed(f"host {h.name}: {res.get('msg')}")
        live = live_mod.from_module(res.get("live_window"), live_window)
        if as_json:
            emit_json({**result.to_dict(), "live": live})
        else:
            print_probe(result)
            print_live(h.name, live)
        raise typer.Exit(0 if result.ok else EXIT_FAILED)
    drift = None if dry_run else hostops.server_flag_drift(h)
    if drift:
        warn_flag_drift(h.name, drift)
    with _interruptible():
        result, baseline = hostops.probe(h, record=record_baseline, record_with_ddtree=with_ddtree, dry_run=dry_run,
                                         progress=_progress)
    if result is None:  # dry run
        if as_json:
            emit_json({"host": h.name, "dry_run": True, "steps": baseline["dry_run"]})
        else:
            for i, step in enumerate(baseline["dry_run"], 1):
                out.print(f"  {i}. {step}", markup=False, highlight=False)
            out.print("dry run: nothing was touched")
        raise typer.Exit(0)
    live = live_mod.read_live(h, live_window)
    if as_json:
        emit_json({**result.to_dict(), "baseline_recorded": bool(baseline), "flag_drift": drift, "live": live})
    else:
        if baseline:
            out.print(f"baseline recorded on {h.name}: {len(baseline['outputs'])} prompts, DDTree {'on' if baseline['ddtree'] else 'off'}")
        print_probe(result)
        print_live(h.name, live)
    raise typer.Exit(0 if result.ok else EXIT_FAILED)


def rollback_cmd(
    host: Optional[str] = HostArg,
    host_opt: Optional[str] = HostOpt,
    to: Optional[str] = typer.Option(None, "--to", help="release id to go back to, or 'installed' for no overlay "
                                     "(default: the recorded previous good release)"),
    force: bool = typer.Option(False, "--force", help="roll back to a release marked bad or interrupted anyway"),
    dry_run: bool = DryRunOpt,
    break_lock: bool = BreakLockOpt,
    engine: str = EngineOpt,
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Switch a host back by hand, mark the release it leaves bad, restart and probe. A release marked bad is
    refused unless --force."""
    h = one_host(host, host_opt, inventory)
    if _engine(engine) == "ansible":
        from ..ansible import engine as ansible_engine

        args = {"to_installed": True} if to == "installed" else ({"to": to} if to else {})
        with _interruptible():
            res = ansible_engine.one_host(h, "ddtree_rollback", {**args, "break_lock": break_lock}, dry_run=dry_run,
                                          progress=_progress)
        if not isinstance(res.get("report"), dict):
            raise OperationFailed(f"host {h.name}: {res.get('msg')}")
        report = ansible_engine.report_from(res["report"], h.name)
        if as_json:
            emit_json(report.to_dict())
        else:
            print_report(report)
        raise typer.Exit(report.exit_code)
    with _interruptible():
        report = hostops.rollback(h, to=None if to == "installed" else to, to_installed=to == "installed",
                                  break_lock=break_lock, force=force, dry_run=dry_run, progress=_progress)
    if as_json:
        emit_json(report.to_dict())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)


def releases_cmd(
    host: Optional[str] = HostArg,
    host_opt: Optional[str] = HostOpt,
    journal: int = typer.Option(10, "--journal", help="journal lines to show"),
    live_window: float = LiveWindowOpt,
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The releases on a host: which is active, which is the rollback target, which are bad; the lock; the journal;
    and live, from the server's DDTree counters: its accept length and decode tok/s over the last --live-window
    seconds ("idle" when it decoded nothing then; "-" and the reason when it is down: the command still succeeds)."""
    h = one_host(host, host_opt, inventory)
    info = hostops.releases(h, journal, live_window)
    if as_json:
        emit_json(info)
        return
    st = ReleaseState.of(info["state"])
    if info.get("flag_drift"):
        warn_flag_drift(h.name, info["flag_drift"])
    rows = []
    for r in reversed(st.releases):
        flags = ", ".join(x for x, on in (("active", r["id"] == st.active), ("rollback target", r["id"] == st.previous_good))
                          if on)
        rows.append([r["id"], r.get("status"), flags, f"{r.get('patchset')} {r.get('patchset_version')}", r.get("base_version"),
                     r.get("created"), r.get("note", "")[:60]])
    out.print(table(f"{h.name}: releases under {info['root']} (current → {info['current'] or 'nothing'})",
                    ["id", "status", "", "patch set", "base", "created", "note"], rows))
    print_live(h.name, info["live"])
    if st.active is None:
        out.print("no overlay active: the server imports the installed package")
    pending = st.pending
    if pending and info.get("lock_state") in ("free", "dead"):
        out.print(f"[bold red]release {pending.get('release')} was switched in by run {pending.get('run')} and never probed; "
                  f"the next command that changes this host settles it (or `ddtree-deploy probe {h.name}` now)[/bold red]",
                  highlight=False)
    elif pending:
        out.print(f"[yellow]release {pending.get('release')} is being probed by run {pending.get('run')}[/yellow]", highlight=False)
    if info["lock"]:
        lk = info["lock"]
        state = {"dead": " — its holder is gone; the next command takes it over", "legacy": ""}.get(info.get("lock_state"), "")
        out.print(f"[yellow]locked by run {lk.get('run_id')} ({lk.get('user')}@{lk.get('control_host')}, since {lk.get('taken')})"
                  f"{state}[/yellow]")
    if info["journal"]:
        out.print(journal_table(info["journal"], f"{h.name}: journal (last {len(info['journal'])})"))


def _journal_value(v: Any) -> str:
    """A journal value as text: nested records (e.g. what DDTree did) as (key=value, ...), never Python reprs."""
    if isinstance(v, dict):
        return "(" + ", ".join(f"{k}={_journal_value(x)}" for k, x in v.items() if x not in (None, "")) + ")"
    if isinstance(v, (list, tuple)):
        return ",".join(_journal_value(x) for x in v)
    return str(v)


def journal_table(lines: list[dict[str, Any]], title: str) -> Any:
    """The journal as a table: time, event, the release it concerns, the run, and the rest as key=value."""
    rows = []
    for line in lines:
        release = line.get("release") or (f"{line.get('from') or 'none'} → {line.get('to') or 'none'}"
                                          if "to" in line or "from" in line else "")
        rest = {k: v for k, v in line.items() if k not in ("time", "event", "host", "release", "from", "to", "run")}
        detail = "  ".join(f"{k}={_journal_value(v)}" for k, v in rest.items() if v not in (None, "", [], {}))
        rows.append([str(line.get("time", ""))[:19].replace("T", " "), line.get("event"), release, line.get("run") or "",
                     detail])
    return table(title, ["time", "event", "release", "run", "detail"], rows)


def register(app: typer.Typer) -> None:
    app.command("apply")(apply_cmd)
    app.command("probe")(probe_cmd)
    app.command("rollback")(rollback_cmd)
    app.command("releases")(releases_cmd)
