"""CLI: ``apply``, ``probe``, ``rollback``, ``releases`` and ``server start|stop|restart|status|logs``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .. import deploy as deploy_mod
from ..console import emit_json, err, out, table
from ..deploy import ApplyReport
from .. import paths
from ..errors import EXIT_FAILED, EXIT_USAGE, InputError
from ..fleet import read_retry_file, rollout, write_retry_file
from ..inventory import Host, resolve_host
from ..probe import ProbeResult
from ..server import ServerControl
from ..transport import HostConnection
from . import hosts as hosts_cmd
from ._options import HostArg, InventoryOpt, JsonOpt, complete_host


def _progress(message: str) -> None:
    err.print(f"[dim]{message}[/dim]" if "[" not in message else message)


# -- rendering -----------------------------------------------------------------------------------------------------------
def print_probe(result: ProbeResult) -> None:
    mark = {"pass": "[green]pass[/green]", "fail": "[bold red]FAIL[/bold red]", "skip": "[yellow]skip[/yellow]",
            "not-run": "[dim]not run[/dim]"}
    t = table(f"{result.host}: {result.label} (release {result.release or 'none: installed package'})",
              ["stage", "result", "seconds", "detail"], [])
    for s in result.stages:
        t.add_row(s.name, mark.get(s.status, s.status), f"{s.seconds:.2f}", s.detail)
    out.print(t)
    failed = result.failed_stage
    if failed and failed.log_tail:
        out.print(f"[bold]log tail ({failed.name}):[/bold]")
        out.print(failed.log_tail, markup=False, highlight=False)


def print_report(report: ApplyReport) -> None:
    if report.status == "dry-run":
        out.print(report.details.get("diff", ""), markup=False, highlight=False)
        from .. import abi

        findings = [abi.Finding(**d) for d in report.details.get("abi", [])]
        if findings:
            out.print(abi.render(findings))
        else:
            out.print("ABI: no findings")
        out.print(f"dry run: {report.message}; nothing was touched")
        return
    if report.probe:
        print_probe(report.probe)
    if report.rollback_probe:
        print_probe(report.rollback_probe)
    style = "green" if report.ok else "bold red"
    out.print(f"[{style}]{report.host}: {report.status}[/{style}]: {report.message}", highlight=False)


def print_recap(reports: list[ApplyReport], skipped: list[str], unusable: dict[str, str] | None = None) -> None:
    rows = []
    for r in reports:
        stage = r.probe.failed_stage.name if r.probe and r.probe.failed_stage else ""
        back = ""
        if r.status in ("rolled-back", "rollback-failed"):
            back = r.rolled_back_to or "installed package"
        rows.append([r.host, r.status, r.release or "", back, stage,
                     f"{sum(r.timings.values()):.1f}", r.message[:90]])
    rows += [[name, "skipped", "", "", "", "", "not started"] for name in skipped]
    rows += [[name, "unusable", "", "", "", "", f"bad host file: {why}"[:90]] for name, why in (unusable or {}).items()]
    out.print(table("recap", ["host", "status", "release", "rolled back to", "failed stage", "seconds", "message"], rows))


def _select_hosts(names: list[str] | None, all_hosts: bool, retry_failed: bool, retry_file: Path,
                  inventory: Path | None) -> tuple[list[Host], dict[str, str]]:
    """The hosts to deploy to, and (for --all) the inventory's unusable ones, which are reported, not deployed."""
    if sum(bool(x) for x in (names, all_hosts, retry_failed)) != 1:
        raise InputError("choose the hosts with exactly one of --host H (repeatable), --all, or --retry-failed")
    if retry_failed:
        names = read_retry_file(retry_file)
    selected, unusable = hosts_cmd.select(names, all_hosts, inventory)
    if not selected:
        raise InputError("no usable host in the inventory" + (f" ({len(unusable)} bad host file(s))" if unusable else ""),
                         hint="`ddtree-deploy hosts list` shows the inventory and what is wrong with it")
    return selected, unusable


# -- commands ------------------------------------------------------------------------------------------------------------
def apply_cmd(
    hosts: list[str] = typer.Option(None, "--host", "-H", help="host to deploy to (repeat for several; the first is the canary)",
                                    autocompletion=complete_host),
    all_hosts: bool = typer.Option(False, "--all", help="every host of the inventory"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="the hosts listed in the retry file of the last apply"),
    retry_file: Optional[Path] = typer.Option(None, "--retry-file", help="where failed hosts are written / read (default: "
                                              "ddtree-deploy.retry in the checkout, else ~/.local/state/ddtree-deploy/last-apply.retry)"),
    patchset: Optional[str] = typer.Option(None, "--patchset", help="patch set name (default: the one for the host's sglang version)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the overlay diff and the ABI verdict; touch nothing"),
    ignore_abi: bool = typer.Option(False, "--ignore-abi", help="push despite ABI errors (loud; for experts)"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the host lock even if another run holds it"),
    max_parallel: int = typer.Option(4, "--max-parallel", min=1, help="hosts deployed at once after the canary"),
    max_fail: int = typer.Option(0, "--max-fail", min=0, help="stop starting new hosts once more than this many failed"),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="do not record a generation baseline on hosts lacking one"),
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Deploy the DDTree overlay: patch set → ABI check → lock → push → switch → restart → probe → roll back on failure.

    Several hosts: the first is the canary; the rest follow in parallel (--max-parallel) until more than --max-fail
    have failed. A host with no generation baseline gets one first (server restarted with DDTree off, the fixed
    prompts recorded in <release_root>/probe-baseline.json). Exit 0 all healthy, 1 a probe failed (rolled back),
    2 bad input, 3 unreachable, 4 ABI, 5 patch.
    """
    retry_file = retry_file or paths.retry_file()
    selected, unusable = _select_hosts(hosts, all_hosts, retry_failed, retry_file, inventory)

    def action(host: Host) -> ApplyReport:
        return deploy_mod.apply(host, patchset=patchset, dry_run=dry_run, ignore_abi=ignore_abi, break_lock=break_lock,
                                record_baseline=not no_baseline, progress=_progress)

    if len(selected) == 1 and not retry_failed and not unusable:
        report = action(selected[0])  # a refusal raises with its own exit code
        if as_json:
            emit_json(report.to_dict())
        else:
            print_report(report)
        raise typer.Exit(report.exit_code)
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
            if not r.ok:
                print_report(r)
        print_recap(result.reports, result.skipped, unusable)
        if result.aborted:
            err.print(f"[bold red]{result.aborted}[/bold red]")
        if path:
            err.print(f"failed hosts written to {path}; rerun with --retry-failed")
    raise typer.Exit(code)


def probe_cmd(
    host: str = HostArg,
    record_baseline: bool = typer.Option(False, "--record-baseline", help="restart with DDTree off, record the fixed prompts' "
                                         "replies as the baseline on the host, restart as configured, then probe"),
    with_ddtree: bool = typer.Option(False, "--with-ddtree", help="record the baseline with DDTree on instead"),
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Probe a host's running server: overlay in use, kernel self-test, start-up/health, generation vs baseline."""
    h = resolve_host(host, inventory)
    result, baseline = deploy_mod.probe(h, record=record_baseline, record_with_ddtree=with_ddtree, progress=_progress)
    if as_json:
        emit_json({**result.to_dict(), "baseline_recorded": bool(baseline)})
    else:
        if baseline:
            out.print(f"baseline recorded on {h.name}: {len(baseline['outputs'])} prompts, DDTree {'on' if baseline['ddtree'] else 'off'}")
        print_probe(result)
    raise typer.Exit(0 if result.ok else EXIT_FAILED)


def rollback_cmd(
    host: str = HostArg,
    to: Optional[str] = typer.Option(None, "--to", help="release id to go back to, or 'installed' for no overlay "
                                     "(default: the recorded previous good release)"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take the host lock even if another run holds it"),
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Switch a host back by hand, mark the release it leaves bad, restart and probe."""
    h = resolve_host(host, inventory)
    report = deploy_mod.rollback(h, to=None if to == "installed" else to, to_installed=to == "installed",
                                 break_lock=break_lock, progress=_progress)
    if as_json:
        emit_json(report.to_dict())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)


def releases_cmd(
    host: str = HostArg,
    journal: int = typer.Option(10, "--journal", help="journal lines to show"),
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The releases on a host: which is active, which is the rollback target, which are bad; the lock; the journal."""
    h = resolve_host(host, inventory)
    info = deploy_mod.releases(h, journal)
    if as_json:
        emit_json(info)
        return
    st = info["state"]
    rows = []
    for r in reversed(st["releases"]):
        flags = ", ".join(x for x, on in (("active", r["id"] == st["active"]), ("rollback target", r["id"] == st["previous_good"]))
                          if on)
        rows.append([r["id"], r.get("status"), flags, f"{r.get('patchset')} {r.get('patchset_version')}", r.get("base_version"),
                     r.get("created"), r.get("note", "")[:60]])
    out.print(table(f"{h.name}: releases under {info['root']} (current → {info['current'] or 'nothing'})",
                    ["id", "status", "", "patch set", "base", "created", "note"], rows))
    if st["active"] is None:
        out.print("no overlay active: the server imports the installed package")
    if info["lock"]:
        lk = info["lock"]
        out.print(f"[yellow]locked by run {lk.get('run_id')} ({lk.get('user')}@{lk.get('control_host')}, since {lk.get('taken')})[/yellow]")
    if info["journal"]:
        out.print(journal_table(info["journal"], f"{h.name}: journal (last {len(info['journal'])})"))


def journal_table(lines: list[dict[str, Any]], title: str) -> Any:
    """The journal as a table: time, event, the release it concerns, the run, and the rest as key=value."""
    rows = []
    for line in lines:
        release = line.get("release") or (f"{line.get('from') or 'none'} → {line.get('to') or 'none'}"
                                          if "to" in line or "from" in line else "")
        rest = {k: v for k, v in line.items() if k not in ("time", "event", "host", "release", "from", "to", "run")}
        detail = "  ".join(f"{k}={v}" for k, v in rest.items() if v not in (None, "", [], {}))
        rows.append([str(line.get("time", ""))[:19].replace("T", " "), line.get("event"), release, line.get("run") or "",
                     detail])
    return table(title, ["time", "event", "release", "run", "detail"], rows)


# -- server ---------------------------------------------------------------------------------------------------------------
server_app = typer.Typer(help="The SGLang server of a host, as its host file's `server` section says (managed process "
                         "with PYTHONPATH=<release_root>/current, or a systemd unit with a drop-in).", no_args_is_help=True)


def _server(host: str, inventory: Path | None, fn: Any) -> Any:
    h = resolve_host(host, inventory)
    with HostConnection(h) as conn:
        ctl = ServerControl(conn)
        active = conn.call("release", "show", root=h.release_root)["state"]["active"]
        return fn(ctl, active)


@server_app.command("start")
def server_start(host: str = HostArg, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Start the server on the active release (DDTree flags on only when an overlay is active)."""
    res = _server(host, inventory, lambda c, a: c.start(release=a, ddtree=a is not None))
    emit_json(res) if as_json else out.print(f"started: {res}")


@server_app.command("stop")
def server_stop(host: str = HostArg, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Stop the server (SIGTERM to its process group, SIGKILL after server.stop_timeout)."""
    res = _server(host, inventory, lambda c, a: c.stop())
    emit_json(res) if as_json else out.print(f"stopped: {res}")


@server_app.command("restart")
def server_restart(host: str = HostArg, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Stop, then start on the active release."""
    res = _server(host, inventory, lambda c, a: c.restart(release=a, ddtree=a is not None))
    emit_json(res) if as_json else out.print(f"restarted: {res}")


@server_app.command("status")
def server_status(host: str = HostArg, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Whether the server runs, its pid, the release it was started on, its uptime."""
    res = _server(host, inventory, lambda c, a: {**c.status(), "active_release": a})
    if as_json:
        emit_json(res)
        return
    out.print(table(f"{host}: server", ["field", "value"], [[k, v] for k, v in res.items()]))
    if not res.get("running"):
        raise typer.Exit(EXIT_FAILED)


@server_app.command("logs")
def server_logs(host: str = HostArg, lines: int = typer.Option(100, "--lines", "-n"),
                previous: bool = typer.Option(False, "--previous", help="the log of the run before this one"),
                inventory: Optional[Path] = InventoryOpt) -> None:
    """The tail of the server log."""
    res = _server(host, inventory, lambda c, a: c.logs(lines, previous=previous))
    out.print(res["text"], markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("apply")(apply_cmd)
    app.command("probe")(probe_cmd)
    app.command("rollback")(rollback_cmd)
    app.command("releases")(releases_cmd)
    app.add_typer(server_app, name="server")
