"""``ddtree-deploy hosts list|check|schema``: the inventory, whether its hosts answer, and the host-file JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from .. import hostpaths, paths
from ..launch_check import check_current_line
from ..cli_errors import Group
from ..console import emit_json, out, table
from ..errors import EXIT_UNREACHABLE, EXIT_USAGE, DeployError, InputError
from ..inventory import Host, host_file_schema, scan_inventory
from ..transport import HostConnection
from ._options import HostsArg, HostsOpt, InventoryOpt, JsonOpt, LimitOpt, many_hosts

app = typer.Typer(cls=Group, help="The host inventory (one YAML file per host): list the hosts, check that they answer. "
                  "Examples to copy: hosts/examples/ in the repo; README: 'Writing a host file for a real host'.",
                  no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="hosts")


def _no_hosts(inventory: Path | None) -> str:
    where = inventory or " or ".join(str(d) for d, _ in paths.inventory_dirs())
    return (f"no hosts in {where} (write one: README 'Writing a host file for a real host'; examples in the "
            "repo's hosts/examples/; or `ddtree-deploy sandbox up`)")


def _row(host: Host) -> dict[str, Any]:
    """A host as ``hosts list`` shows it: the port and user an SSH host really gets, as OpenSSH resolves its
    target (ssh_config.py), and the inventory its file came from."""
    row: dict[str, Any] = {"ok": True, **host.summary()}
    if host.connection != "local":
        from ..ssh_config import resolve

        try:
            where = resolve(host)
        except DeployError as exc:
            return {**row, "ok": False, "error": exc.message}
        row.update(hostname=where.hostname, port=where.port, user=where.user, ssh_config_by=where.by)
    return row


@app.command("list")
def list_cmd(inventory: Optional[Path] = InventoryOpt, as_json: bool = JsonOpt) -> None:
    """List the hosts of the inventory, validating every file (exit 2 if a file is bad; the rest are listed): where
    each goes (HostName, port and user as `ssh -G` resolves them), its groups, and the inventory it came from."""
    inv = scan_inventory(inventory)
    inv.warn()
    rows: list[dict[str, Any]] = [_row(h) for h in inv.hosts.values()]
    rows += [{"ok": False, "name": n, "file": inv.broken_files[n], "error": e.message} for n, e in inv.broken.items()]
    if as_json:
        emit_json(rows)
    elif not rows:
        out.print(_no_hosts(inventory))
    else:
        out.print(table(f"hosts in {inv.describe()}",
                        ["name", "target", "port", "user", "groups", "server", "from", "file"],
                        [[r["name"], r["target"] + (f" ({r['hostname']})" if r.get("hostname") not in (None, r["target"])
                                                    else ""), r["port"] or "", r.get("user") or "",
                          ",".join(r["groups"]), r["server"], r["inventory"], r["file"]] if r["ok"]
                         else [r["name"], "UNUSABLE", "", "", "", r["error"], "", r["file"]] for r in rows]))
    if inv.broken or not all(r["ok"] for r in rows):
        raise typer.Exit(EXIT_USAGE)


@app.command("check")
def check_cmd(
    names: Optional[list[str]] = HostsArg,
    host_opts: Optional[list[str]] = HostsOpt,
    limit: Optional[list[str]] = LimitOpt,
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Connect to each host and report its Python and installed SGLang version, resolve its paths there, and parse
    its server's launch line with the SGLang it runs (the active release's, DDTree flags included, or the installed
    one's without them), as `apply` does before a restart (exit 3 if one is unreachable, 2 if a host file is bad, its
    release_root resolves into site-packages or the package, or its launch line has a flag that SGLang does not
    take). Hosts: HOST... / -H PATTERN / --limit PATTERN; default: every usable host."""
    selected, unusable = many_hosts(names, host_opts, limit, False, inventory, default_all=True)
    if not selected and not unusable:
        if as_json:
            emit_json([])
        else:
            out.print(_no_hosts(inventory))
        return
    rows, worst = [], 0
    for host in selected:
        try:
            with HostConnection(host) as conn:
                info = conn.call("hostinfo", "check", site_packages=host.site_packages, release_root=host.release_root,
                                 interpreter=host.python, timeout=host.connect_timeout * 6)
                wrong = hostpaths.problems(host, info["paths"])
                if not wrong and info.get("sglang_dir_exists"):
                    try:
                        info["launch"] = check_current_line(conn, host)
                    except InputError as exc:  # the host answers; its launch line would not start the server
                        wrong = [str(exc).removeprefix(f"{host.source}: ")]
            if wrong:
                worst = max(worst, EXIT_USAGE)
                rows.append({"host": host.name, "ok": False, **info, "error": f"{host.source}: " + "; ".join(wrong)})
            else:
                rows.append({"host": host.name, "ok": True, **info})
        except DeployError as exc:
            worst = max(worst, exc.exit_code if exc.exit_code != 1 else EXIT_UNREACHABLE)
            rows.append({"host": host.name, "ok": False, "error": str(exc)})
    for name, why in unusable.items():
        worst = max(worst, EXIT_USAGE)
        rows.append({"host": name, "ok": False, "error": why})
    if as_json:
        emit_json(rows)
    else:
        out.print(table("host check", ["host", "ok", "python", "sglang", "detail"], [
            [r["host"], "yes" if r["ok"] else "NO", r.get("python"), r.get("sglang"),
             r.get("error") or (_launch_detail(r) if r.get("sglang_dir_exists") else "no sglang in site_packages")]
            for r in rows]))
    if worst:
        raise typer.Exit(worst)


def _launch_detail(row: dict[str, Any]) -> str:
    lc = row.get("launch") or {}
    if not lc:
        return ""
    if lc.get("checked"):
        return f"launch line parsed by sglang {lc.get('version')} ({lc.get('release') or 'installed'})"
    return f"launch line not parsed: {lc.get('why')}"


def schema_text() -> str:
    """The host-file JSON Schema as committed in hosts/host.schema.json (sorted keys, two-space indent)."""
    return json.dumps(host_file_schema(), indent=2, sort_keys=True) + "\n"


@app.command("schema")
def schema_cmd(output: Optional[Path] = typer.Option(None, "--output", metavar="FILE", help="write it to FILE "
                                                         "instead of stdout")) -> None:
    """The JSON Schema of a host file, for completion and checking in editors: put
    `# yaml-language-server: $schema=<path>/host.schema.json` at the top of a host file (the repo has it as
    hosts/host.schema.json). The CLI's own checks are stricter than the schema (cross-field rules)."""
    text = schema_text()
    if output is None:
        out.file.write(text)
        return
    output.write_text(text)
    out.print(f"wrote {output}", highlight=False)
