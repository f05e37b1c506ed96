"""The ``ddtree-deploy`` command line. Thin: parse, call the module that owns the job, print, exit with its code.

Exit codes: 0 ok; 1 operation failed (probe failed, rolled back); 2 usage or bad input; 3 host unreachable or SSH
failure; 4 ABI incompatibility; 5 patch does not apply to this base.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from . import __version__
from .console import emit_json, err, out, table
from .errors import DeployError, EXIT_USAGE
from .inventory import load_inventory, resolve_host
from .sandbox import DEFAULT_HOSTS, Sandbox
from .transport import HostConnection

app = typer.Typer(
    help=(
        "Deploy DDTree speculative decoding onto the SGLang already installed on your GPU hosts.\n\n"
        "Flow: snapshot the installed SGLang → check a DDTree patch set applies → ABI-check the hosts → push an overlay "
        "release (the installed package is never edited) → restart → probe → roll back automatically on failure.\n\n"
        "Exit codes: 0 ok, 1 failed (rolled back), 2 bad input, 3 host unreachable, 4 ABI incompatible, 5 patch does not apply."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
hosts_app = typer.Typer(help="The host inventory (hosts/*.yaml): list hosts, check that they answer.", no_args_is_help=True)
sandbox_app = typer.Typer(
    help="Local sandbox hosts: one sshd per host on loopback in its own mount namespace, each with a real SGLang "
    "release installed, and a host YAML written into the inventory. Needs root and openssh-server.",
    no_args_is_help=True,
)
app.add_typer(hosts_app, name="hosts")
app.add_typer(sandbox_app, name="sandbox")

InventoryOpt = typer.Option(None, "--inventory", "-i", help="inventory directory (default: $DDTREE_INVENTORY or ./hosts)")
JsonOpt = typer.Option(False, "--json", help="print JSON instead of a table")


def _version(value: bool) -> None:
    if value:
        out.print(f"ddtree-deploy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version")) -> None:
    """Deploy DDTree onto installed SGLang."""


# -- hosts ---------------------------------------------------------------------------------------------------------------
@hosts_app.command("list")
def hosts_list(inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """List the hosts of the inventory (validating every file)."""
    hosts = load_inventory(inventory)
    rows = [h.summary() for h in hosts.values()]
    if as_json:
        emit_json(rows)
        return
    out.print(table("hosts", ["name", "target", "port", "python", "release root", "server", "file"],
                    [[r["name"], r["target"], r["port"] or 22, r["python"], r["release_root"], r["server"], r["file"]] for r in rows]))


@hosts_app.command("check")
def hosts_check(
    names: list[str] = typer.Argument(None, help="hosts to check (default: all)"),
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Connect to each host and report its Python and installed SGLang version (exit 3 if one is unreachable)."""
    hosts = load_inventory(inventory)
    selected = [resolve_host(n, inventory) for n in names] if names else list(hosts.values())
    rows, failed = [], 0
    for host in selected:
        try:
            with HostConnection(host) as conn:
                info = conn.call("hostinfo", "check", site_packages=host.site_packages, timeout=host.connect_timeout * 6)
            rows.append({"host": host.name, "ok": True, **info})
        except DeployError as exc:
            failed += 1
            rows.append({"host": host.name, "ok": False, "error": str(exc)})
    if as_json:
        emit_json(rows)
    else:
        out.print(table("host check", ["host", "ok", "python", "sglang", "detail"], [
            [r["host"], "yes" if r["ok"] else "NO", r.get("python"), r.get("sglang"),
             r.get("error") or ("" if r.get("sglang_dir_exists") else "no sglang in site_packages")] for r in rows]))
    if failed:
        raise typer.Exit(3)


# -- sandbox -------------------------------------------------------------------------------------------------------------
SandboxDirOpt = typer.Option(None, "--dir", help="sandbox state directory (default: $DDTREE_SANDBOX_DIR or ./.sandbox)")


@sandbox_app.command("up")
def sandbox_up(
    sandbox_dir: Optional[Path] = SandboxDirOpt,
    inventory: Optional[Path] = InventoryOpt,
    extra_hosts: int = typer.Option(0, "--extra-hosts", min=0, max=16, help="more hosts on the patch set's base release (fleet tests)"),
) -> None:
    """Start the sandbox hosts (idempotent: what exists and runs is kept)."""
    specs = DEFAULT_HOSTS + tuple((f"sandbox-base-{i + 2}", DEFAULT_HOSTS[0][1]) for i in range(extra_hosts))
    box = Sandbox(sandbox_dir, inventory, log=lambda m: err.print(f"[dim]{m}[/dim]"))
    state = box.up(specs)
    out.print(table("sandbox", ["host", "sglang", "ssh port", "server port", "inventory file"],
                    [[h.name, h.sglang, h.ssh_port, h.server_port, h.inventory_file] for h in state.hosts.values()]))


@sandbox_app.command("status")
def sandbox_status(sandbox_dir: Optional[Path] = SandboxDirOpt, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """Show the sandbox hosts and whether their sshd answers."""
    rows = Sandbox(sandbox_dir, inventory).status()
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print("no sandbox hosts (run `ddtree-deploy sandbox up`)")
        return
    out.print(table("sandbox", ["host", "sglang", "ssh port", "running", "inventory file"],
                    [[r["name"], r["sglang"], r["ssh_port"], "yes" if r["running"] else "NO", r["inventory_file"]] for r in rows]))


@sandbox_app.command("down")
def sandbox_down(sandbox_dir: Optional[Path] = SandboxDirOpt, inventory: Optional[Path] = InventoryOpt) -> None:
    """Stop every sandbox process and remove everything the sandbox made (its files and host YAMLs)."""
    removed = Sandbox(sandbox_dir, inventory).down()
    out.print(f"removed sandbox hosts: {', '.join(removed) or 'none'}")


#: Modules under ddtree_deploy/commands/ that add their commands to the app (each defines ``register(app)``).
COMMAND_MODULES = ("snapshot", "abi", "patchset", "deploy")


def _register_commands() -> None:
    import importlib

    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"ddtree_deploy.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ddtree_deploy.commands.{name}":
                continue  # that part of the tool is not built yet
            raise
        module.register(app)


_register_commands()


def main() -> None:
    """Console-script entry: run the app, turning DeployError into its message and exit code."""
    try:
        code = app(standalone_mode=False)  # click returns an Exit's code instead of raising it here
    except DeployError as exc:
        from rich.markup import escape  # messages quote code such as "Optional[int]": never read them as markup

        err.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, markup=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(1)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(EXIT_USAGE if isinstance(exc, click.exceptions.UsageError) else exc.exit_code)
        raise
    sys.exit(code if isinstance(code, int) else 0)
