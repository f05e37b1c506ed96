"""``ddtree-deploy snapshot``: copy the installed SGLang off hosts into the content-addressed store, and read it back.

``snapshot HOST [HOST...]`` takes snapshots (``take`` is implied); ``list``, ``show``, ``diff`` and ``verify`` read
the store. Exit codes: 0 ok, 1 verify found damage, 2 bad input (unknown host or snapshot), 3 host unreachable.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich import filesize
from rich.progress import (BarColumn, DownloadColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)
from rich.text import Text

from ..cli_errors import Group, NoSuchCommand
from ..console import Waiting, emit_json, err, out, table
from ..errors import EXIT_USAGE, DeployError, OperationFailed
from ..facts import get
from ..inventory import resolve_host
from ..snapshot import Snapshot, SnapshotStore
from ._options import AllHostsOpt, HostsArg, HostsOpt, InventoryOpt, JsonOpt, LimitOpt, StoreOpt, many_hosts



class _DefaultToTake(Group):
    """``snapshot HOST`` means ``snapshot take HOST``: anything that is not a subcommand (or the help) is taken for
    hosts, except a word close to a subcommand that no host or group of the inventory is called (``snapshot lst``:
    no such command, did you mean 'list'?)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            if not args[0].startswith("-") and _typo_of_a_command(args[0], list(self.commands), args):
                raise NoSuchCommand(args[0], list(self.commands), ctx)
            args = ["take", *args]
        return super().parse_args(ctx, args)


def _typo_of_a_command(word: str, commands: list[str], args: list[str]) -> bool:
    if not NoSuchCommand(word, commands).possibilities:
        return False
    from ..inventory import scan_inventory

    given = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--inventory", "-i")), None)
    try:
        inv = scan_inventory(Path(given) if given else None)
    except DeployError:
        return False  # the take command reports the inventory's problem
    return word not in inv.hosts and word not in inv.broken and word not in inv.groups


snapshot_app = typer.Typer(
    cls=_DefaultToTake,
    no_args_is_help=True,
    help="Snapshot the SGLang installed on hosts: exact bytes (a store shared by all hosts, only missing blobs cross "
    "the wire), a sha256 manifest and the host's facts (python, glibc, torch build, driver, GPUs, kernel packages). "
    "`snapshot HOST` takes one; list/show/diff/verify read the store.",
)


def register(app: typer.Typer) -> None:
    app.add_typer(snapshot_app, name="snapshot")


def _summary(s: Snapshot) -> dict[str, Any]:
    stats = s.info.get("stats", {})
    return {"id": s.id, "host": s.host, "created": s.created, "package": s.package, "version": s.package_version,
            "files": stats.get("files"), "bytes": stats.get("bytes"), "transferred_blobs": stats.get("blobs_transferred"),
            "transferred_bytes": stats.get("bytes_transferred"), "seconds": round(stats.get("seconds", 0.0), 3)}


def _stage_text(stage: str, done: int, total: int) -> str:
    """A stage as a person reads it: the manifest as a count of files (hashed on the host), a transfer in MB."""
    if stage == "manifest":
        return f"manifest: {done} files listed" if done else "manifest: the host is listing and hashing the files"
    if total:
        return f"{stage}: {done / 1e6:.1f}/{total / 1e6:.1f} MB"
    return stage


class _StageColumn(ProgressColumn):
    """Bytes for the transfer, a count of files for the manifest (never ``0/? bytes``)."""

    def __init__(self) -> None:
        super().__init__()
        self._bytes = DownloadColumn()

    def render(self, task: Task) -> Text:
        if task.description == "manifest":
            return Text(f"{int(task.completed)} files" if task.completed else "listing files", style="progress.download")
        if task.total is None:  # nothing (more) to fetch: what came, never a total of '?'
            return Text(f"{filesize.decimal(int(task.completed))} fetched" if task.completed else "no blobs to fetch",
                        style="progress.download")
        return self._bytes.render(task)


def _plain_lines(label: str, stage: dict[str, str], as_json: bool) -> Any:
    """Where stderr is not a terminal (no progress bar), a plain line every 10 s with the stage; nothing for --json."""
    if as_json or err.is_terminal:
        return nullcontext()
    return Waiting(label, detail=lambda: stage["text"], detail_name="stage")


@snapshot_app.command("take")
def take(
    names: Optional[list[str]] = HostsArg,
    host_opts: Optional[list[str]] = HostsOpt,
    limit: Optional[list[str]] = LimitOpt,
    all_hosts: bool = AllHostsOpt,
    inventory: Optional[Path] = InventoryOpt,
    store: Optional[Path] = StoreOpt,
    refresh: bool = typer.Option(False, "--refresh", help="re-hash every file and re-import torch on the host (ignore its caches)"),
    as_json: bool = JsonOpt,
) -> None:
    """Snapshot hosts (what `snapshot HOST` runs). Exit 3 if a host is unreachable; the others are still taken."""
    hosts, unusable = many_hosts(names, host_opts, limit, all_hosts, inventory)
    st = SnapshotStore(store)
    rows: list[dict[str, Any]] = []
    worst = 0
    for host in hosts:
        stage = {"text": "manifest"}
        with Progress(SpinnerColumn(), TextColumn(f"[bold]{host.name}[/bold] {{task.description}}"), BarColumn(),
                      _StageColumn(), TransferSpeedColumn(), TimeRemainingColumn(), TimeElapsedColumn(), console=err,
                      transient=True, disable=as_json or not err.is_terminal) as bar, \
                _plain_lines(f"{host.name}: snapshot", stage, as_json):
            task = bar.add_task("manifest", total=None)

            def progress(name: str, done: int, total: int, bar: Progress = bar, task: Any = task,
                         stage: dict[str, str] = stage) -> None:
                bar.update(task, description=name, completed=done, total=total or None)
                stage["text"] = _stage_text(name, done, total)

            try:
                snap = st.take(host, progress=progress, refresh=refresh)
            except DeployError as exc:
                worst = max(worst, exc.exit_code)
                rows.append({"host": host.name, "error": str(exc)})
                err.print(f"[bold red]{host.name}:[/bold red] {exc}", highlight=False)
                continue
        rows.append(_summary(snap))
    for name, why in unusable.items():
        worst = max(worst, EXIT_USAGE)
        rows.append({"host": name, "error": why})
    if as_json:
        emit_json(rows)
    else:
        out.print(table("snapshots taken", ["host", "id", "version", "files", "MB", "sent blobs", "sent MB", "seconds"], [
            [r["host"], r.get("id", "FAILED"), r.get("version"), r.get("files"), _mb(r.get("bytes")),
             r.get("transferred_blobs"), _mb(r.get("transferred_bytes")), r.get("seconds")] for r in rows]))
    if worst:
        raise typer.Exit(worst)


@snapshot_app.command("list")
def list_(host: Optional[str] = typer.Argument(None, help="only this host's snapshots"),
          store: Optional[Path] = StoreOpt, as_json: bool = JsonOpt) -> None:
    """List snapshots, oldest first."""
    snaps = SnapshotStore(store).list(host)
    rows = [_summary(s) for s in snaps]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print("no snapshots" + (f" of {host}" if host else "") + " (take one with `ddtree-deploy snapshot HOST`)")
        return
    out.print(table("snapshots", ["id", "host", "created", "version", "files", "MB"],
                    [[r["id"], r["host"], r["created"][:19], r["version"], r["files"], _mb(r["bytes"])] for r in rows]))


def fact_rows(facts: dict[str, Any]) -> list[tuple[str, Any]]:
    """The facts a person reads first, in a stable order (the full record is in --json)."""
    gpus = get(facts, "gpu.gpus", [])
    compiled = get(facts, "sglang.compiled", [])
    rows: list[tuple[str, Any]] = [
        ("python", f"{get(facts, 'python.version')} ({get(facts, 'python.implementation')}, {get(facts, 'python.abi_tag')})"),
        ("platform", f"{get(facts, 'python.platform')}  glibc {get(facts, 'glibc')}"),
        ("torch", f"{get(facts, 'torch.version', '-')}  [{get(facts, 'torch.status')}]"
                  + (f"  {get(facts, 'torch.error')}" if get(facts, "torch.error") else "")),
        ("torch.version.cuda", get(facts, "torch.cuda", "none")),
        ("CXX11 ABI", get(facts, "torch.cxx11_abi")),
        ("arch list", " ".join(get(facts, "torch.arch_list", [])) or "-"),
        ("driver", f"{get(facts, 'gpu.driver', '-')} (CUDA <= {get(facts, 'gpu.cuda_max', '-')})  [{get(facts, 'gpu.status')}]"),
        ("GPUs", ", ".join(f"{g.get('name')} (sm {g.get('compute_cap')})" for g in gpus) or "none"),
    ]
    for name, info in (get(facts, "packages", {}) or {}).items():
        if info:
            pin = f"  (pins torch{info['requires_torch']})" if info.get("requires_torch") else ""
            rows.append((name, f"{info.get('version')}{pin}"))
    rows.append(("wheel tags", ", ".join(get(facts, "sglang.wheel_tags", [])) or "-"))
    rows.append(("compiled .so", "\n".join(
        f"{c['path']}{'  (links libtorch)' if c.get('links_libtorch') else ''}  glibc>={c.get('glibc_max')}" for c in compiled) or "none"))
    return [(k, escape(str(v))) for k, v in rows]


@snapshot_app.command("show")
def show(ref: str = typer.Argument(..., help="snapshot id, unique prefix, or host name (its latest)"),
         store: Optional[Path] = StoreOpt, as_json: bool = JsonOpt,
         files: bool = typer.Option(False, "--files", help="also list every file of the manifest")) -> None:
    """Show a snapshot's facts (and with --files its manifest)."""
    snap = SnapshotStore(store).get(ref)
    if as_json:
        doc: dict[str, Any] = {**snap.info, "facts": snap.facts}
        if files:
            doc["manifest"] = snap.manifest
        emit_json(doc)
        return
    out.print(table(f"snapshot {snap.id} of {snap.host} ({snap.package} {snap.package_version}, {snap.created[:19]})",
                    ["fact", "value"], fact_rows(snap.facts)))
    if files:
        out.print(table("manifest", ["path", "size", "mode", "sha256"],
                        [[p, e["size"], oct(e["mode"]), e["sha256"][:16]] for p, e in sorted(snap.manifest.items())]))


@snapshot_app.command("diff")
def diff(a: str = typer.Argument(..., help="first snapshot (id, prefix or host name)"),
         b: str = typer.Argument(..., help="second snapshot"),
         store: Optional[Path] = StoreOpt, as_json: bool = JsonOpt,
         limit: int = typer.Option(40, help="at most this many paths per section in the table")) -> None:
    """Files added, removed and changed from A to B, and the facts that differ."""
    d = SnapshotStore(store).diff(a, b)
    if as_json:
        emit_json(d)
        return
    out.print(f"[bold]{d['a']['id']}[/bold] ({d['a']['host']}, {d['a']['version']}) → "
              f"[bold]{d['b']['id']}[/bold] ({d['b']['host']}, {d['b']['version']}): "
              f"{len(d['added'])} added, {len(d['removed'])} removed, {len(d['changed'])} changed, {d['unchanged']} unchanged")
    for section in ("added", "removed", "changed"):
        paths = d[section]
        if paths:
            more = f"\n… {len(paths) - limit} more (--json for all)" if len(paths) > limit else ""
            out.print(table(section, ["path"], [[p] for p in paths[:limit]]))
            if more:
                out.print(more)
    if d["facts"]:
        out.print(table("facts that differ", ["fact", "A", "B"],
                        [[k, json.dumps(v["a"]), json.dumps(v["b"])] for k, v in d["facts"].items()]))


@snapshot_app.command("verify")
def verify(ref: str = typer.Argument(..., help="snapshot id, prefix or host name"),
           repair: bool = typer.Option(False, "--repair", help="fetch damaged or missing blobs again from the "
                                       "snapshot's host (each checked against the manifest), then verify again"),
           inventory: Optional[Path] = InventoryOpt,
           store: Optional[Path] = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Check that every blob of a snapshot is present and matches its sha256 (exit 1 if not); --repair mends it."""
    st = SnapshotStore(store)
    snap = st.get(ref)
    problems = st.verify(snap)
    if problems and repair:
        host = resolve_host(snap.host, inventory)
        fixed = st.repair(snap, host)
        if not as_json:
            out.print(f"snapshot {snap.id}: fetched {len(fixed['repaired'])} blob(s) again from {host.name}: "
                      + ", ".join(fixed["repaired"][:6]) + (" …" if len(fixed["repaired"]) > 6 else ""), highlight=False)
        problems = st.verify(snap)
    if as_json:
        emit_json({"id": snap.id, "host": snap.host, "ok": not problems, "problems": problems})
    elif problems:
        out.print(table(f"snapshot {snap.id}: {len(problems)} problem(s)", ["problem"], [[p] for p in problems]))
    else:
        out.print(f"snapshot {snap.id} of {snap.host}: {len(snap.manifest)} files, every blob present and intact")
    if problems:
        raise OperationFailed(f"snapshot {snap.id}: {len(problems)} damaged or missing blob(s)") if not as_json else typer.Exit(1)


def _mb(n: Any) -> str:
    return "" if n is None else f"{n / 1e6:.1f}"
