"""``ddtree-deploy abi``: the binary-compatibility matrix of hosts and the findings of the ABI rules.

Facts come from each host's latest snapshot (no SSH), from the host itself with ``--live`` (one round trip each,
plus the launch check: the server's launch line parsed by the SGLang a restart would run, launch_check), or from
recorded facts files (``--facts``). With ``--require``/``--base-version``/``--built-on`` it checks an overlay
the way ``deploy apply`` will before pushing. Exit 4 when any finding is an error, 3 when a host is unreachable
(``--live``), 2 on bad input (unknown host, no snapshot, unreadable facts file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from .. import abi
from ..console import emit_json, err, out
from ..errors import EXIT_ABI, EXIT_UNREACHABLE, EXIT_USAGE, DeployError, InputError
from ..facts import gather
from ..inventory import Host
from ..launch_check import check_current_line
from ..transport import HostConnection
from ..snapshot import SnapshotStore
from ._options import AllHostsOpt, HostsArg, HostsOpt, InventoryOpt, LimitOpt, StoreOpt, many_hosts

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def register(app: typer.Typer) -> None:
    app.command("abi")(abi_command)


def _load_facts_file(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read facts file: {exc.strerror}") from exc
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):
        data = data["facts"]  # the output of `snapshot show --json`
    if not isinstance(data, dict) or "torch" not in data or "python" not in data:
        raise InputError(f"{path}: not a facts record (expected the JSON of `snapshot show --json`'s 'facts', with "
                         "'python' and 'torch' sections)")
    return str(data.get("host") or path.stem), data


def launch_findings(host: Host) -> list[abi.Finding]:
    """``--live``: the launch line a restart would start, parsed on the host by that SGLang's own ServerArgs; a flag it
    refuses is an error (the server would exit before serving), as in ``hosts check`` and before ``apply``'s switch."""
    if not host.server.get("command"):
        return []
    try:
        with HostConnection(host) as conn:
            check_current_line(conn, host)
    except InputError as exc:
        return [abi.Finding(abi.ERROR, host.name, "launch_line", exc.message,
                            "a restart (apply, rollback) starts a server that exits while parsing its arguments",
                            exc.hint or "fix the flag in the host file")]
    return []


def parse_requirements(items: list[str]) -> dict[str, str]:
    """``["torch>=2.11,<2.12", "python>=3.10"]`` -> ``{"torch": ">=2.11,<2.12", "python": ">=3.10"}``."""
    reqs = {}
    for item in items:
        m = _REQ.match(item)
        if not m or not m.group(2):
            raise InputError(f"--require {item!r}: expected NAME SPECIFIER, e.g. 'torch>=2.11,<2.12' or 'python>=3.10'")
        reqs[m.group(1)] = m.group(2).strip()
    return reqs


def abi_command(
    names: Optional[list[str]] = HostsArg,
    host_opts: Optional[list[str]] = HostsOpt,
    limit: Optional[list[str]] = LimitOpt,
    all_hosts: bool = AllHostsOpt,
    live: bool = typer.Option(False, "--live", help="read facts from the hosts now (one SSH round trip each)"),
    facts_files: list[Path] = typer.Option(None, "--facts", help="a recorded facts JSON file to include as a host (repeatable)"),
    require: list[str] = typer.Option(None, "--require", help="patch-set requirement to check, e.g. 'torch>=2.11,<2.12' (repeatable)"),
    base_version: Optional[str] = typer.Option(None, "--base-version", help="sglang version the patch set is built for"),
    built_on: Optional[str] = typer.Option(None, "--built-on", help="host whose build the overlay's compiled files come from "
                                            "(each other host must match it)"),
    inventory: Optional[Path] = InventoryOpt,
    store: Optional[Path] = StoreOpt,
    as_json: bool = typer.Option(False, "--json", help="print JSON (matrix and findings) instead of tables"),
) -> None:
    """Compare hosts' binary-compatibility facts (python ABI, glibc, torch release + CUDA tag, driver vs CUDA, GPU arch
    vs arch list, kernel packages and their torch pins) and report what breaks, why and how to fix it. Exit 4 on errors."""
    facts_by_host: dict[str, dict[str, Any]] = {}
    if not (names or host_opts or limit or all_hosts or facts_files):
        raise InputError("name at least one host (their latest snapshots unless --live), or give --all or --facts FILE")
    hosts, unusable_files = ([], {}) if not (names or host_opts or limit or all_hosts) else many_hosts(
        names, host_opts, limit, all_hosts, inventory)
    st = SnapshotStore(store)
    unreachable: list[str] = []
    launch: list[abi.Finding] = []  # --live only: the launch line checks
    for host in hosts:
        if live:
            try:
                facts_by_host[host.name] = gather(host)
                launch.extend(launch_findings(host))
            except DeployError as exc:  # report it and compare the others; exit 3 at the end
                unreachable.append(host.name)
                err.print(f"[bold red]{host.name}:[/bold red] {escape(str(exc))}")
        else:
            snap = st.latest(host.name)
            if snap is None:
                raise InputError(f"no snapshot of {host.name} in {st.root}: run `ddtree-deploy snapshot {host.name}` "
                                 "or use --live")
            facts_by_host[host.name] = snap.facts
    for path in facts_files or []:
        name, data = _load_facts_file(path)
        facts_by_host[name] = data
    overlay_mode = bool(require or base_version or built_on)
    if overlay_mode:
        requires = parse_requirements(require or [])
        built_from = None
        if built_on:
            if built_on not in facts_by_host:
                raise InputError(f"--built-on {built_on}: not among the hosts compared ({', '.join(facts_by_host)})")
            built_from = facts_by_host[built_on]
        findings: list[abi.Finding] = []
        for name, facts in facts_by_host.items():
            findings.extend(abi.check_overlay(name, facts, built_from_facts=built_from, carries_compiled=built_from is not None,
                                              requires=requires, base_version=base_version or ""))
        findings.extend(f for f in abi.rule_shared_binaries(facts_by_host) if f.severity == abi.INFO)
        findings = abi.sort_findings(findings)
    else:
        findings = abi.check_hosts(facts_by_host)
    findings = abi.sort_findings([*findings, *launch]) if launch else findings
    if as_json:
        emit_json({"hosts": list(facts_by_host), "unreachable": unreachable, "matrix": abi.matrix_rows(facts_by_host),
                   "findings": [f.to_dict() for f in findings], "errors": sum(f.severity == abi.ERROR for f in findings)})
    else:
        out.print(abi.matrix(facts_by_host))
        if findings:
            out.print(abi.render(findings))
        errors = sum(f.severity == abi.ERROR for f in findings)
        warnings = sum(f.severity == abi.WARNING for f in findings)
        out.print(f"{errors} error(s), {warnings} warning(s)" + ("  → incompatible (exit 4)" if errors else ""))
    if abi.has_errors(findings):
        raise typer.Exit(EXIT_ABI)
    if unreachable:
        raise typer.Exit(EXIT_UNREACHABLE)
    if unusable_files:
        raise typer.Exit(EXIT_USAGE)
