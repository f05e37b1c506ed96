"""`patchset port` rebuilds the 0.5.18 series from 0.5.17 against the real 0.5.18 wheel, through the CLI.

The committed ``patches/ddtree/sglang-0.5.18`` was made this way: the port reports every hunk, stops at the two hunks
of 0003 that 0.5.18's DSA graph variants conflict with (exit 5, nothing written into the patches tree, the file
with diff3 markers under --work), and, given the edited file, writes a series byte-identical to the committed one.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from cli_inproc import run_cli
from v2_helpers import REPO, base_wheel

from ddtree_deploy.errors import EXIT_PATCH, EXIT_USAGE
from ddtree_deploy.patchset.apply import apply_patchset
from ddtree_deploy.patchset.base import WheelBase
from ddtree_deploy.patchset.format import load_patchset

RUNNER = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
COMMITTED = REPO / "patches" / "ddtree" / "sglang-0.5.18"


def _family(root: Path) -> Path:
    """patches/ddtree with the shared folders and the 0.5.17 series only (no 0.5.18 yet)."""
    fam = root / "ddtree"
    for name in ("runtime", "spec-v2", "sglang-0.5.17"):
        shutil.copytree(REPO / "patches" / "ddtree" / name, fam / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def _port(root: Path, work: Path, *extra: str):
    return run_cli("patchset", "port", "ddtree", "--from", "0.5.17", "--to", "0.5.18", "--wheel",
                   str(base_wheel("0.5.18")), "--patches", str(root), "--work", str(work), "--json", *extra, cwd=REPO)


def test_port_rebuilds_the_0518_series(tmp_path: Path):
    root, work = _family(tmp_path / "patches"), tmp_path / "work"
    dest = root / "ddtree" / "sglang-0.5.18"

    r = _port(root, work)
    assert r.returncode == EXIT_PATCH, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert not rep["ok"] and "0003-graph-mask.patch conflict" in rep["error"]
    assert not dest.exists(), "nothing is written into the patches tree on a conflict"
    by_patch = {p["name"]: p for p in rep["patches"]}
    assert [p["status"] for p in rep["patches"]] == ["clean", "clean", "conflict", "clean"]
    # the hooks: each target read on 0.5.18; the three whose definition changed get their new hash (checked below
    # against the committed series) and are reported for review
    hooks = {h["target"].rsplit(".", 1)[1]: h for h in rep["hooks"]}
    assert len(rep["hooks"]) == 11 and sorted(k for k, h in hooks.items() if h["status"] == "changed") == [
        "__init__", "_calculate_spec_decoding_metrics", "forward_extend"]
    assert all(h["new"] != h["old"] and "line(s) in its definition" in h["detail"] for h in rep["hooks"]
               if h["status"] == "changed")
    conflicts = [(h["file"], h["header"].split(" @@")[0]) for h in by_patch["0003-graph-mask.patch"]["hunks"]
                 if h["status"] == "conflict"]
    assert conflicts == [(RUNNER, "@@ -447,6 +463,8"), (RUNNER, "@@ -912,7 +938,12")], conflicts
    counts = rep["counts"]
    assert counts["conflict"] == 2 and counts["merged"] >= 3 and counts["offset"] >= 15 and counts["clean"] >= 1
    marked = work / "0003-graph-mask.patch" / RUNNER
    assert by_patch["0003-graph-mask.patch"]["files"][1]["conflict_file"] == str(marked)
    text = marked.read_text()
    assert text.count("<<<<<<< 0.5.18") == 2 and text.count("||||||| 0.5.17") == 2
    assert text.count(">>>>>>> 0003-graph-mask.patch") == 2

    # a file still holding markers is no resolution
    r = _port(root, work)
    assert r.returncode == EXIT_PATCH and "still has conflict markers" in r.stdout

    # the maintainer's edit: the file as the committed 0.5.18 series makes it (0004 does not touch it)
    wheel = WheelBase(base_wheel("0.5.18"))
    overlay = apply_patchset(load_patchset(COMMITTED / "patchset.yaml"), wheel).overlay
    marked.write_bytes(next(f.content for f in overlay.files if f.path == RUNNER))

    r = _port(root, work, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["dry_run"] and not dest.exists(), "--dry-run writes nothing"

    r = _port(root, work)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["written"] and rep["series"] == [p.name for p in load_patchset(COMMITTED).patches]
    assert rep["requires"]["torch"] == ">=2.13,<2.14", "the torch line the 0.5.18 wheel pins"
    assert [p["status"] for p in rep["patches"]] == ["clean", "clean", "resolved", "clean"]
    for f in rep["series"]:
        assert (dest / f).read_bytes() == (COMMITTED / f).read_bytes(), f"{f} differs from the committed series"
    # patchset.yaml: the committed one, stack pins read from the 0.5.18 wheel, but for the CUDA major, which METADATA
    # does not say: the port copies 0.5.17's (either) and names it for review; the maintainer set 13 (0.5.18's
    # torch 2.13 stack is CUDA 13 only). The traits are copied too, and named.
    committed = (COMMITTED / "patchset.yaml").read_text()
    assert "  cuda: 13  " in committed and '  kernel: "0.4.6.post1"' in committed
    assert (dest / "patchset.yaml").read_text() == committed.replace("  cuda: 13  ", "  cuda: null"), (
        "patchset.yaml differs from the committed one beyond the reviewed CUDA major")
    assert any(n.startswith("stack.cuda: copied from 0.5.17 (null)") for n in rep["notes"]), rep["notes"]
    assert any(n.startswith("traits: copied from 0.5.17 (draft_width: \"hook\"") for n in rep["notes"]), rep["notes"]
    assert (dest / "README.md").is_file()

    r = _port(root, work)
    assert r.returncode == EXIT_USAGE and "--force" in r.stdout, "an existing series folder needs --force"
    r = _port(root, work, "--force")
    assert r.returncode == 0, r.stdout + r.stderr

    # the written series is the one `patchset check` applies, fuzz 0, to its own wheel
    r = run_cli("patchset", "check", "ddtree", "--base", str(base_wheel("0.5.18")), "--patches", str(root),
                "--json", cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(s["status"] == "applied" for s in json.loads(r.stdout)["steps"])


def test_port_skips_a_patch_upstream_has(tmp_path: Path):
    """A series entry that says its change is upstream from the new base on is left out of the port (reported as
    skipped, named in the notes); the others are ported as before."""
    root, work = _family(tmp_path / "patches"), tmp_path / "work"
    y = root / "ddtree" / "sglang-0.5.17" / "patchset.yaml"
    y.write_text(y.read_text().replace("  - 0004-hybrid.patch\n", '  - {patch: 0004-hybrid.patch, upstream_merged: "0.5.18"}\n'))
    r = _port(root, work, "--dry-run")
    assert r.returncode == EXIT_PATCH, r.stdout + r.stderr  # 0003 still conflicts
    rep = json.loads(r.stdout)
    assert [p["status"] for p in rep["patches"]] == ["clean", "clean", "conflict", "skipped"]
    assert "in sglang since 0.5.18" in rep["patches"][3]["hunks"][0]["detail"]
    assert rep["series"] == ["0001-dispatch.patch", "0002-worker.patch", "0003-graph-mask.patch"]
    assert not work.exists(), "--dry-run writes nothing, not even the work directory"
