"""``ddtree-deploy patchset …``: list, show, check, diff, and the developer workflow (dev, refresh, port).

Thin: resolve the patch set and the base, call patchset.apply / patchset.dev, print a table or JSON, exit with the
error's code (2 bad patch set, 5 does not apply).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..cli_errors import Group
from ..console import emit_json, err, out, table
from ..errors import DeployError, InputError, PatchDoesNotApply
from ..patchset.apply import apply_patchset, render_diff
from ..patchset.base import BaseSource, open_base
from ..patchset.format import PatchSet, default_patches_root, find_patchset_for, list_patchset_names, load_patchset
from ._options import DryRunOpt, JsonOpt, PatchesOpt

app = typer.Typer(
    cls=Group,
    help="DDTree patch sets (patches/<name>/sglang-<version>/patchset.yaml): a versioned series of patches plus "
    "vendored runtime files, applied all-or-nothing with no fuzz onto a base (a host snapshot or a released wheel) "
    "to make an overlay. `dev` and `refresh` edit a series as git commits, like quilt or patch-package.\n\n"
    "Exit codes: 2 bad patch set or flag, 5 the series does not apply to this base.",
    no_args_is_help=True,
)

NameArg = typer.Argument(..., help="patch set: NAME/DIR (ddtree/sglang-0.5.11), a bare NAME (ddtree: picked by the "
                         "base's version), or a path to a patch-set folder or patchset.yaml")
SnapshotOpt = typer.Option(None, "--snapshot", help="base: a snapshot from the local store ($DDTREE_SNAPSHOTS): id, "
                           "unique prefix, or host name for its latest (`ddtree-deploy snapshot list`)")
BaseOpt = typer.Option(None, "--base", help="base: a released wheel, PACKAGE==VERSION (sglang==0.5.23, downloaded once "
                       "and cached) or a path to a .whl file")
DriftOpt = typer.Option(False, "--allow-base-drift", help="try the series on a base other than the one it was made for "
                        "(version or file hashes differ); reported loudly in the output and the overlay notes")
ThreeWayOpt = typer.Option(False, "--3way", help="when a patch does not apply exactly, retry it as a 3-way merge "
                           "against the patch set's own base release; every patch that needed it is reported")


def _resolve(name: str, base: BaseSource | None, root: Optional[Path], allow_drift: bool) -> PatchSet:
    if base is not None and "/" not in name and not Path(name).exists():
        return find_patchset_for(name, base.version, package=base.package, root=root, allow_drift=allow_drift)
    return load_patchset(name, root=root)


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        err.print(f"[dim]{message}[/dim]", highlight=False)


@app.command("list")
def list_cmd(root: Optional[Path] = PatchesOpt, as_json: bool = JsonOpt) -> None:
    """List the patch sets under the patches root (each one validated; a broken one shows its error)."""
    root = root or default_patches_root()
    rows = []
    for name in list_patchset_names(root):
        try:
            ps = load_patchset(name, root=root)
            rows.append({"name": name, "ok": True, "version": ps.version,
                         "base": f"{ps.base_package} {ps.base_version}", "patches": len(ps.patches),
                         "runtime_files": sum(len(v.files) for v in ps.vendored), "path": str(ps.yaml_path)})
        except DeployError as exc:
            rows.append({"name": name, "ok": False, "error": str(exc)})
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print(f"no patch sets under {root}")
        return
    out.print(table(f"patch sets in {root}", ["name", "version", "base", "patches", "vendored files", "problem"],
                    [[r["name"], r.get("version"), r.get("base"), r.get("patches"), r.get("runtime_files"),
                      r.get("error", "")] for r in rows]))


@app.command("show")
def show_cmd(name: str = NameArg, root: Optional[Path] = PatchesOpt, as_json: bool = JsonOpt) -> None:
    """Show a patch set: base and its file hashes, requirements, the series (files, +/- lines) and runtime files."""
    ps = load_patchset(name, root=root)
    info = ps.describe()
    if as_json:
        emit_json(info)
        return
    out.print(f"[bold]{escape(ps.qualified_name)}[/bold] {escape(ps.version)}  ({escape(str(ps.yaml_path))})", highlight=False)
    if ps.description:
        out.print(ps.description, markup=False, highlight=False)
    out.print(f"base: {ps.base_package} {ps.base_version}, {len(ps.base_files)} file hash(es)   requires: "
              + (", ".join(f"{k} {v}" for k, v in ps.requires.items()) or "nothing"), markup=False, highlight=False)
    out.print(table("series (applied in order, git apply -p1, no fuzz)", ["#", "patch", "subject", "files", "+", "-"],
                    [[i, s["name"], s["subject"], "\n".join(s["files"]), s["added"], s["removed"]]
                     for i, s in enumerate(info["series"], 1)]))
    for i, v in enumerate(ps.vendored):
        what = "runtime" if ps.runtime is not None and i == 0 else "vendored"
        out.print(f"{what}: {len(v.files)} file(s) from {v.source} → {v.dest}/")


@app.command("check")
def check_cmd(
    name: str = NameArg,
    snapshot: Optional[str] = SnapshotOpt,
    base: Optional[str] = BaseOpt,
    allow_base_drift: bool = DriftOpt,
    three_way: bool = ThreeWayOpt,
    root: Optional[Path] = PatchesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Does the series apply to this base? Checks version and base-file hashes, applies every patch onto a staging
    copy, and prints the overlay it would make (exit 5 naming patch, file and hunk if not; nothing is produced)."""
    src = open_base(snapshot=snapshot, base=base)
    ps = _resolve(name, src, root, allow_base_drift)
    try:
        result = apply_patchset(ps, src, allow_base_drift=allow_base_drift, three_way=three_way, progress=_progress)
    except PatchDoesNotApply as exc:
        if as_json:
            emit_json({"ok": False, "patchset": ps.qualified_name, "base": src.describe(), "error": exc.message,
                       "details": getattr(exc, "details", {})})
            raise typer.Exit(exc.exit_code) from None
        raise
    if as_json:
        emit_json({"patchset": ps.qualified_name, "base": src.describe(), **result.describe()})
        return
    for w in result.warnings:
        err.print(f"[bold yellow]WARNING:[/bold yellow] {escape(w)}", highlight=False)
    out.print(f"[bold]{escape(ps.qualified_name)}[/bold] {escape(ps.version)} on {src.package} {src.version} "
              f"({escape(src.label)})", highlight=False)
    for step in result.steps:
        colour = "green" if step.status == "applied" else "yellow"
        out.print(f"  [{colour}]{step.status:<8}[/{colour}] {escape(step.name)}  ({escape(', '.join(step.files))})"
                  + (f"\n           {escape(step.detail)}" if step.detail else ""), highlight=False)
    for h in ps.hooks:
        out.print(f"  [green]hooked[/green]   {escape(h.type)} {escape(h.target)}  (sha256 {h.sha256[:12]})",
                  highlight=False)
    ov = result.overlay
    out.print(f"overlay {ov.digest[:16]} ({len(ov.files)} files):", highlight=False)
    for f in ov.files:
        out.print(f"  {f.action:<8} {f.mode:o} {len(f.content):>8} B  {escape(f.path)}", highlight=False)
    for note in ov.notes:
        if note not in result.warnings:
            err.print(f"[bold yellow]NOTE:[/bold yellow] {escape(note)}", highlight=False)
    replaced = [f.path for f in ov.files if f.action == "replace"]
    out.print(f"[green]ok[/green]: {len(ps.patches)} patch(es) apply"
              + (f", {len(ps.hooks)} hook target(s) match" if ps.hooks else "")
              + f"; overlay of {len(ov.files)} file(s), replacing {len(replaced)} {src.package} file(s)")


@app.command("diff")
def diff_cmd(
    name: str = NameArg,
    snapshot: Optional[str] = SnapshotOpt,
    base: Optional[str] = BaseOpt,
    allow_base_drift: bool = DriftOpt,
    three_way: bool = ThreeWayOpt,
    root: Optional[Path] = PatchesOpt,
    no_pager: bool = typer.Option(False, "--no-pager", help="never page, even on a terminal"),
) -> None:
    """Print the unified diff the overlay makes against the base, file by file (paged on a terminal). The output
    applies with `git apply -p1` onto the base."""
    src = open_base(snapshot=snapshot, base=base)
    ps = _resolve(name, src, root, allow_base_drift)
    result = apply_patchset(ps, src, allow_base_drift=allow_base_drift, three_way=three_way, progress=_progress)
    for note in result.overlay.notes:
        err.print(f"[bold yellow]NOTE:[/bold yellow] {escape(note)}", highlight=False)
    text = render_diff(result.overlay, src)
    if sys.stdout.isatty() and not no_pager:
        import os

        from rich.syntax import Syntax

        os.environ.setdefault("LESS", "-FRX")  # colours through less; no pager at all for a one-screen diff

        with out.pager(styles=True):
            out.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
    else:
        sys.stdout.write(text)


@app.command("build")
def build_cmd(
    name: str = NameArg,
    out_dir: Path = typer.Option(..., "--out", help="new directory to write (must not exist, or be empty)"),
    snapshot: Optional[str] = SnapshotOpt,
    base: Optional[str] = BaseOpt,
    full: bool = typer.Option(False, "--full", help="also write every unchanged base file, so the output alone is "
                              "an importable patched package (put it first on PYTHONPATH)"),
    allow_base_drift: bool = DriftOpt,
    three_way: bool = ThreeWayOpt,
    root: Optional[Path] = PatchesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Write the overlay the series makes on this base into a directory, laid out like site-packages (with an
    overlay.json naming its digest and files). Nothing on any host changes."""
    from ..patchset.build import write_overlay

    src = open_base(snapshot=snapshot, base=base)
    ps = _resolve(name, src, root, allow_base_drift)
    result = apply_patchset(ps, src, allow_base_drift=allow_base_drift, three_way=three_way, progress=_progress)
    for w in result.warnings:
        err.print(f"[bold yellow]WARNING:[/bold yellow] {escape(w)}", highlight=False)
    built = write_overlay(result.overlay, src, out_dir, full=full)
    if as_json:
        emit_json({"patchset": ps.qualified_name, "base": src.describe(), "out": str(built.out),
                   "digest": built.digest, "overlay_files": built.overlay_files, "base_files": built.base_files})
        return
    out.print(f"[green]built[/green] {escape(ps.qualified_name)} on {src.package} {src.version} -> "
              f"{escape(str(built.out))}: {built.overlay_files} overlay file(s)"
              + (f" + {built.base_files} base file(s)" if full else "") + f", digest {built.digest[:16]}",
              highlight=False)


@app.command("dev")
def dev_cmd(
    name: str = NameArg,
    directory: Path = typer.Argument(..., help="new directory for the git work tree"),
    snapshot: Optional[str] = SnapshotOpt,
    base: Optional[str] = BaseOpt,
    allow_base_drift: bool = typer.Option(False, "--allow-base-drift", help="open the series on another base to port "
                                          "it (patches are applied with git am --3way; the tree stops at a conflict)"),
    root: Optional[Path] = PatchesOpt,
) -> None:
    """Make a git work tree to edit the series: the whole base package as the first commit (tag ddtree-base), then
    one commit per patch. Edit, commit (one commit per patch), then run `patchset refresh NAME DIR`."""
    from ..patchset.dev import make_dev_tree

    src = open_base(snapshot=snapshot, base=base)
    ps = _resolve(name, src, root, allow_base_drift)
    with err.status("building the work tree") as status:
        tree = make_dev_tree(ps, src, directory, allow_base_drift=allow_base_drift,
                             progress=lambda m: status.update(m))
    for w in tree.warnings:
        err.print(f"[bold yellow]WARNING:[/bold yellow] {escape(w)}", highlight=False)
    out.print(f"work tree {tree.path}: {src.package} {src.version} + {len(tree.applied)} patch commit(s) of "
              f"{ps.qualified_name}\nedit and commit there, then: ddtree-deploy patchset refresh {ps.yaml_path.parent} {tree.path}")


@app.command("refresh")
def refresh_cmd(
    name: str = NameArg,
    directory: Path = typer.Argument(..., help="the work tree made by `patchset dev`"),
    renumber: bool = typer.Option(False, "--renumber", help="name every patch NNNN-<subject>.patch instead of keeping "
                                  "the existing names of unchanged patches"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would be written (files, +/- lines); write nothing"),
    diff: bool = typer.Option(False, "--diff", help="with --dry-run: also print the full diff of every file"),
    root: Optional[Path] = PatchesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Write the work tree's commits after the base back as the series (one .patch per commit) and the sha256 of
    every base file they touch into patchset.yaml (its comments are kept). Refuses a dirty tree."""
    if diff and not dry_run:
        raise InputError("--diff goes with --dry-run")
    from ..patchset.dev import read_state, refresh_patchset

    if "/" not in name and not Path(name).exists():  # a bare name: the patch set the work tree was made from
        recorded = read_state(directory)
        if recorded["name"].split("/", 1)[0] != name:
            raise InputError(f"{directory} was made from {recorded['name']}, not {name!r}; name the patch set to "
                             "refresh into (NAME/DIR or a path)")
        name = recorded["patchset"]
    ps = load_patchset(name, root=root)
    res = refresh_patchset(ps, directory, renumber=renumber, dry_run=dry_run)
    if as_json:
        emit_json({k: v for k, v in res.__dict__.items() if diff or k != "diffs"})
        return
    if dry_run:
        from ..dryrun import numstat, summary_lines

        stats = numstat("".join(f"diff --git a/{n} b/{n}\n" + d for n, d in res.diffs.items()))
        out.print(f"[bold]{ps.qualified_name}: refresh from {directory} would change[/bold]")
        out.print("\n".join(summary_lines(stats)) if stats else "  nothing (the series is up to date)", markup=False,
                  highlight=False)
        if diff:
            for d in res.diffs.values():
                out.print(d, markup=False, highlight=False)
        out.print("dry run: nothing was written")
        return
    out.print(table(f"{ps.qualified_name} refreshed from {directory}", ["patch", "status"],
                    [[n, "written" if n in res.written else "unchanged"] for n in res.series]
                    + [[n, "removed"] for n in res.removed]))
    out.print(f"base.files: {len(res.base_files)} hash(es); patchset.yaml "
              f"{'updated' if res.yaml_rewritten else 'unchanged'}"
              + ("" if res.yaml_comments_kept else " (re-written: its comments could not be kept)"))


@app.command("port")
def port_cmd(
    name: str = typer.Argument(..., help="patch-set name (ddtree): the series of --from is ported"),
    from_version: str = typer.Option(..., "--from", help="the base release whose series is ported (e.g. 0.5.17)"),
    to_version: str = typer.Option(..., "--to", help="the new base release (e.g. 0.5.18)"),
    wheel: Optional[Path] = typer.Option(None, "--wheel", help="the new base as a wheel file (default: the released "
                                         "wheel of --to, downloaded once and cached)"),
    snapshot: Optional[str] = SnapshotOpt,
    work: Optional[Path] = typer.Option(None, "--work", help="where conflicting files are written (diff3 markers) to "
                                        "edit; run the port again with the same --work to take the edited files "
                                        "(default: a new temporary directory, named in the report)"),
    force: bool = typer.Option(False, "--force", help="replace the series and patchset.yaml of an existing "
                               "sglang-<to> folder"),
    dry_run: bool = DryRunOpt,
    root: Optional[Path] = PatchesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Make the series for a new base by three-way rebase of the --from series, hunk by hunk: clean, offset, already
    present upstream, merged, or conflict (exit 5: the conflicting files are written under --work to edit and
    nothing is written into the patches tree). When everything ports, writes <root>/<name>/sglang-<to>/ (series,
    patchset.yaml with the new base's version, file hashes and the torch/python it pins)."""
    from ..patchset.base import WheelBase
    from ..patchset.port import port_patchset
    from ..wheels import fetch_wheel

    if wheel is not None and snapshot:
        raise InputError("give at most one of --wheel or --snapshot")
    ps = find_patchset_for(name, from_version, root=root)
    old = WheelBase(fetch_wheel(ps.base_package, from_version), package=ps.base_package)
    if snapshot:
        new = open_base(snapshot=snapshot)
    elif wheel is not None:
        new = open_base(base=str(wheel))
    else:
        new = open_base(base=f"{ps.base_package}=={to_version}")
    try:
        res = port_patchset(ps, old, new, to_version=to_version, work=work, force=force, dry_run=dry_run,
                            progress=_progress)
    except PatchDoesNotApply as exc:
        res = getattr(exc, "port", None)
        if res is None:
            raise
        if as_json:
            emit_json({**res.describe(), "error": exc.message})
        else:
            _port_report(res)
        if not as_json:
            raise
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        emit_json(res.describe())
        return
    _port_report(res)


_PORT_COLOURS = {"clean": "green", "offset": "green", "new-file": "green", "present": "cyan", "merged": "yellow",
                 "resolved": "yellow", "conflict": "red"}


def _port_report(res) -> None:
    rows = []
    for p in res.patches:
        for h in p.hunks:
            c = _PORT_COLOURS.get(h.status, "white")
            hunk = h.header.split(" @@")[0] + " @@" if h.header.startswith("@@") else h.header
            rows.append([p.name, h.file.removeprefix("sglang/srt/"), hunk, f"[{c}]{h.status}[/{c}]", h.detail])
    out.print(table(f"{res.name}: sglang {res.from_version} -> {res.to_version} ({res.base['source']})",
                    ["patch", "file (under sglang/srt/)", "hunk", "status", "detail"], rows))
    for p in res.patches:
        for f in p.files:
            if f.conflict_file:
                out.print(f"[red]conflict[/red] {escape(p.name)} {escape(f.path)}: {f.conflicts} region(s), edit "
                          f"{escape(f.conflict_file)}", highlight=False)
    if res.hooks:
        colours = {"unchanged": "green", "changed": "yellow", "missing": "red"}
        out.print(table(f"hooks: {sum(h.status == 'changed' for h in res.hooks)} of {len(res.hooks)} target(s) "
                        "changed", ["hook", "file (under sglang/srt/)", "status", "detail"],
                        [[h.hook, h.file.removeprefix("sglang/srt/"),
                          f"[{colours[h.status]}]{h.status}[/{colours[h.status]}]", h.detail] for h in res.hooks]))
    for n in res.notes:
        err.print(f"[bold yellow]NOTE:[/bold yellow] {escape(n)}", highlight=False)
    if res.conflicts or res.hook_conflicts:
        return
    where = "would be written" if res.dry_run else "written"
    out.print(f"[green]ok[/green]: {len(res.series)} patch(es) {where} to {escape(res.dest)}; requires "
              + ", ".join(f"{k} {v}" for k, v in res.requires.items()), highlight=False)
    if res.dry_run:
        out.print("dry run: nothing was written")


def register(root_app: typer.Typer) -> None:
    root_app.add_typer(app, name="patchset")
