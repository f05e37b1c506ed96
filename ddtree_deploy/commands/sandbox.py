"""``ddtree-deploy sandbox up|status|down``: local hosts that behave like remote ones (see ddtree_deploy.sandbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..cli_errors import Group
from ..console import emit_json, err, out, table
from ..sandbox import DEFAULT_HOSTS, Sandbox
from ._options import InventoryOpt, JsonOpt

app = typer.Typer(
    cls=Group,
    help="Local sandbox hosts: one sshd per host on loopback in its own mount namespace, each with a real SGLang "
    "release installed, and a host YAML written into the inventory. Needs root and openssh-server.",
    no_args_is_help=True,
)
SandboxDirOpt = typer.Option(None, "--dir", help="sandbox state directory (default: $DDTREE_SANDBOX_DIR, the "
                             "checkout's .sandbox/, else ~/.local/state/ddtree-deploy/sandbox)")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="sandbox")


@app.command("up")
def up_cmd(
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


@app.command("status")
def status_cmd(sandbox_dir: Optional[Path] = SandboxDirOpt, inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
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


@app.command("down")
def down_cmd(sandbox_dir: Optional[Path] = SandboxDirOpt, inventory: Optional[Path] = InventoryOpt) -> None:
    """Stop every sandbox process and remove everything the sandbox made (its files and host YAMLs)."""
    removed = Sandbox(sandbox_dir, inventory).down()
    out.print(f"removed sandbox hosts: {', '.join(removed) or 'none'}")
