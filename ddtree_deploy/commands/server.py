"""CLI: ``server start|stop|restart|status|logs`` — the SGLang server of a host, as its host file says.

start, stop and restart take the host lock (they never interleave with an apply) and have ``--dry-run``; Ctrl-C or
SIGTERM during one is handed to the host like any write command's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ..cli_errors import Group
from .. import hostops
from ..console import emit_json, err, out, table
from ..errors import EXIT_FAILED
from ..hoststate import ReleaseState
from ..inventory import Host
from ..server import ServerControl
from ..transport import HostConnection
from ._options import BreakLockOpt, DryRunOpt, HostArg, HostOpt, InventoryOpt, JsonOpt, one_host
from ._writes import interruptible, progress

server_app = typer.Typer(cls=Group, help="The SGLang server of a host, as its host file's `server` section says (managed process "
                         "with PYTHONPATH=<release_root>/current, or a systemd unit with a drop-in). start, stop and "
                         "restart take the host lock (they never interleave with an apply).", no_args_is_help=True)


def _server_read(h: Host, fn: Any) -> Any:
    with HostConnection(h) as conn:
        ctl = ServerControl(conn)
        active = ReleaseState.read(conn, h).active
        return fn(ctl, active)


def _server_write(h: Host, action: str, dry_run: bool, wait: bool, break_lock: bool, as_json: bool) -> None:
    with interruptible():
        res = hostops.server_action(h, action, dry_run=dry_run, wait=wait, break_lock=break_lock, progress=progress)
    failed = (res.get("startup") or {}).get("status") == "fail"
    if as_json:
        emit_json(res)
    elif dry_run:
        out.print(f"dry run: would {res['would']}; nothing was touched", highlight=False)
    else:
        if res.get("reconciled"):
            err.print(f"[bold yellow]{h.name}: {res['reconciled']}[/bold yellow]", highlight=False)
        what = {"start": "started", "stop": "stopped", "restart": "restarted"}[action]
        started = res.get("started") or res
        pid = started.get("pid") if isinstance(started, dict) else None
        line = f"{h.name}: {what}" + (f" (pid {pid})" if pid else "") + f" on {res.get('active_release') or 'the installed package'}"
        if res.get("startup"):
            line += f"; start-up: {res['startup']['status']} — {res['startup']['detail']}"
        out.print(f"[{'bold red' if failed else 'green'}]{line}[/]", highlight=False)
        if failed and res.get("log_tail"):
            out.print(res["log_tail"], markup=False, highlight=False)
    raise typer.Exit(EXIT_FAILED if failed else 0)


NoWaitOpt = typer.Option(False, "--no-wait", help="return once the process is started; do not wait for /health")


@server_app.command("start")
def server_start(host: Optional[str] = HostArg, host_opt: Optional[str] = HostOpt, dry_run: bool = DryRunOpt, no_wait: bool = NoWaitOpt,
                 break_lock: bool = BreakLockOpt, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Start the server on the active release (DDTree flags on only when an overlay is active) and wait for /health.
    Refused when another process (one the tool did not start) already holds the server port."""
    _server_write(one_host(host, host_opt, inventory), "start", dry_run, not no_wait, break_lock, as_json)


@server_app.command("stop")
def server_stop(host: Optional[str] = HostArg, host_opt: Optional[str] = HostOpt, dry_run: bool = DryRunOpt, break_lock: bool = BreakLockOpt,
                inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Stop the server (SIGTERM to its process group, SIGKILL after server.stop_timeout)."""
    _server_write(one_host(host, host_opt, inventory), "stop", dry_run, False, break_lock, as_json)


@server_app.command("restart")
def server_restart(host: Optional[str] = HostArg, host_opt: Optional[str] = HostOpt, dry_run: bool = DryRunOpt, no_wait: bool = NoWaitOpt,
                   break_lock: bool = BreakLockOpt, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Stop, then start on the active release, and wait for /health."""
    _server_write(one_host(host, host_opt, inventory), "restart", dry_run, not no_wait, break_lock, as_json)


@server_app.command("status")
def server_status(host: Optional[str] = HostArg, host_opt: Optional[str] = HostOpt, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Whether the server runs, its pid, the release it was started on, its uptime; a server on the port that the
    tool did not start is named."""
    h = one_host(host, host_opt, inventory)
    res = _server_read(h, lambda c, a: {**c.status(), "active_release": a})
    if as_json:
        emit_json(res)
        return
    out.print(table(f"{h.name}: server", ["field", "value"], [[k, v] for k, v in res.items() if k != "foreign" or v]))
    if res.get("foreign"):
        port = h.server.get("port")
        err.print(f"[bold yellow]{h.name}: no server of ddtree-deploy runs, but port {port} is held by "
                  f"{res['foreign']} (a server the tool did not start)[/bold yellow]", highlight=False)
    if not res.get("running"):
        raise typer.Exit(EXIT_FAILED)


@server_app.command("logs")
def server_logs(host: Optional[str] = HostArg, host_opt: Optional[str] = HostOpt, lines: int = typer.Option(100, "--lines", "-n"),
                previous: bool = typer.Option(False, "--previous", help="the log of the run before this one"),
                inventory: Optional[Path] = InventoryOpt) -> None:
    """The tail of the server log."""
    res = _server_read(one_host(host, host_opt, inventory), lambda c, a: c.logs(lines, previous=previous))
    out.print(res["text"], markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")
