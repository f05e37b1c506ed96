"""The developer workflow on real wheels: dev → edit → refresh, porting to a new base, and its refusals.

Round-trip contract (decided here, asserted below):
- a series written by ``refresh`` comes back **byte-identical** through dev → refresh (patches and patchset.yaml);
- a hand-written series comes back in ``git format-patch`` form, **semantically identical**: the same overlay.
Each test builds a whole-package work tree (the brief's contract), so they are the slowest patch-set tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from cli_inproc import run_cli

from ddtree_deploy.errors import EXIT_PATCH, EXIT_USAGE, InputError
from ddtree_deploy.patchset.dev import BASE_TAG, make_dev_tree, refresh_patchset
from ddtree_deploy.patchset import SeriesDoesNotApply, WheelBase, build_overlay, load_patchset
from ddtree_deploy.wheels import fetch_wheel

PATCHSETS = Path(__file__).resolve().parent / "patchsets"
DEVICE_CONFIG = "sglang/srt/configs/device_config.py"
AUTHOR = ["-c", "user.name=ddtree-deploy tests", "-c", "user.email=tests@ddtree-deploy.invalid"]


@pytest.fixture(scope="module")
def wheel_023() -> WheelBase:
    return WheelBase(fetch_wheel("sglang", "0.5.23"))


@pytest.fixture(scope="module")
def wheel_011() -> WheelBase:
    return WheelBase(fetch_wheel("sglang", "0.5.11"))


@pytest.fixture
def work_root(tmp_path: Path):
    """Where work trees go: RAM-backed /dev/shm when there is one (a whole-package tree is ~6k files, and on this
    project's CI disk writing them dominates the test time), else the test's tmp_path. Same code either way."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="ddtree-dev-test-", dir=shm))
        yield root
        shutil.rmtree(root, ignore_errors=True)
    else:
        yield tmp_path / "trees"


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *AUTHOR, *args], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def copy_family(name: str, dest: Path) -> Path:
    shutil.copytree(PATCHSETS / name, dest / name)
    return dest / name


def snapshot_dir(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_dev_edit_refresh_round_trip(wheel_023: WheelBase, tmp_path: Path, work_root: Path) -> None:
    family = copy_family("sample", tmp_path)
    ps_dir = family / "sglang-0.5.23"
    before = snapshot_dir(ps_dir)
    ps = load_patchset(ps_dir)
    tree = make_dev_tree(ps, wheel_023, work_root / "work")
    work = tree.path
    assert tree.applied == ps.series
    # the whole package is there, base commit tagged, one commit per patch
    assert git(work, "ls-tree", "-r", "--name-only", BASE_TAG).splitlines() == wheel_023.list_files()
    assert git(work, "rev-list", "--count", f"{BASE_TAG}..HEAD").strip() == "2"
    overlay = build_overlay(ps, wheel_023)
    for f in overlay.files:
        if not f.path.startswith(ps.runtime.dest + "/"):  # the runtime is vendored, not part of the tree
            assert (work / f.path).read_bytes() == f.content, f.path

    # no edit: refresh writes nothing, every byte of the patch set is as it was
    res = refresh_patchset(ps, work)
    assert res.written == [] and res.removed == [] and not res.yaml_rewritten
    assert res.unchanged == ps.series
    assert snapshot_dir(ps_dir) == before

    # edit: amend patch 2, add a third commit
    (work / DEVICE_CONFIG).write_text((work / DEVICE_CONFIG).read_text() + "\nDDTREE_MAX_DEPTH = 8\n")
    git(work, "commit", "-q", "-a", "--amend", "--no-edit")
    utils = work / "sglang/srt/speculative/spec_utils.py"
    utils.write_text("# DDTree sample: tree verify lives in ddtree_sample.\n" + utils.read_text())
    git(work, "commit", "-q", "-a", "-m", "spec utils: point at the DDTree sample runtime")
    res = refresh_patchset(load_patchset(ps_dir), work)
    assert res.series == [*ps.series, "0003-spec-utils-point-at-the-ddtree-sample-runtime.patch"]
    assert res.unchanged == [ps.series[0]] and res.written == res.series[1:]
    assert res.yaml_rewritten and res.yaml_comments_kept
    yaml_text = (ps_dir / "patchset.yaml").read_text()
    assert "# applied in order: git apply -p1, no fuzz" in yaml_text  # comments survive
    assert "    sglang/srt/speculative/spec_utils.py: " + wheel_023.sha256("sglang/srt/speculative/spec_utils.py") in yaml_text

    # what was written applies to the base and gives exactly the work tree's files
    edited = load_patchset(ps_dir)
    ov = build_overlay(edited, wheel_023)
    for path in edited.touched_files():
        assert {f.path: f.content for f in ov.files}[path] == (work / path).read_bytes(), path

    # and it round-trips byte for byte: a fresh dev tree of the refreshed series refreshes to the same bytes
    after = snapshot_dir(ps_dir)
    again = make_dev_tree(edited, wheel_023, work_root / "work2")
    res2 = refresh_patchset(edited, again.path)
    assert res2.written == [] and not res2.yaml_rewritten
    assert snapshot_dir(ps_dir) == after


def test_hand_written_series_round_trips_semantically(wheel_011: WheelBase, tmp_path: Path, work_root: Path) -> None:
    family = copy_family("moved", tmp_path)
    ps_dir = family / "sglang-0.5.11"
    ps = load_patchset(ps_dir)
    original = build_overlay(ps, wheel_011)
    tree = make_dev_tree(ps, wheel_011, work_root / "work")
    # the DEP-3 description became the commit message
    assert git(tree.path, "log", "-1", "--format=%s").strip() == "DeviceConfig gains a ddtree_enabled flag"
    res = refresh_patchset(ps, tree.path)
    assert res.series == ps.series and res.written == ps.series  # same name, new (format-patch) bytes
    rewritten = (ps_dir / ps.series[0]).read_text()
    assert rewritten.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH] DeviceConfig gains a ddtree_enabled flag" in rewritten
    assert build_overlay(load_patchset(ps_dir), wheel_011).digest == original.digest


def test_port_to_a_new_base_with_drift(wheel_023: WheelBase, tmp_path: Path, work_root: Path) -> None:
    """Porting: open the 0.5.11 series on 0.5.23 (3-way with pristine blobs), refresh into a 0.5.23 patch set."""
    family = copy_family("moved", tmp_path)
    old = load_patchset(family / "sglang-0.5.11")
    with pytest.raises(Exception) as refused:
        make_dev_tree(old, wheel_023, work_root / "nodrift")
    assert getattr(refused.value, "exit_code", None) == EXIT_PATCH
    tree = make_dev_tree(old, wheel_023, work_root / "work", allow_base_drift=True)
    assert any("BASE DRIFT" in w for w in tree.warnings)
    new_dir = family / "sglang-0.5.23"
    shutil.copytree(family / "sglang-0.5.11", new_dir)
    (new_dir / "patchset.yaml").write_text((new_dir / "patchset.yaml").read_text().replace('"0.5.11"', '"0.5.23"'))
    with pytest.raises(InputError) as wrong_target:
        refresh_patchset(old, tree.path)  # the 0.5.11 patch set cannot take a 0.5.23 tree
    assert "was made from sglang 0.5.23" in str(wrong_target.value)
    refresh_patchset(load_patchset(new_dir), tree.path)
    ported = load_patchset(new_dir)
    assert ported.base_files[DEVICE_CONFIG] == wheel_023.sha256(DEVICE_CONFIG)
    ov = build_overlay(ported, wheel_023)  # exact apply now, no drift, no 3-way
    assert ov.notes == () and ov.files[0].content == (tree.path / DEVICE_CONFIG).read_bytes()
    assert b"    ddtree_enabled: bool = False\n" in ov.files[0].content


def test_dev_stops_at_a_conflict_and_refresh_refuses_bad_trees(wheel_023: WheelBase, tmp_path: Path, work_root: Path) -> None:
    family = copy_family("conflict", tmp_path)
    ps = load_patchset(family / "sglang-0.5.11")
    with pytest.raises(SeriesDoesNotApply) as err:
        make_dev_tree(ps, wheel_023, work_root / "work", allow_base_drift=True)
    d = err.value.details
    assert d["patch"] == "0002-device-config-accept-ddtree.patch" and d["applied"] == ["0001-corpus-manager-flag.patch"]
    assert "refresh" in (err.value.hint or "")
    work = work_root / "work"
    # refresh refuses the tree while the conflict is unresolved
    port = family / "sglang-0.5.23"
    shutil.copytree(family / "sglang-0.5.11", port)
    (port / "patchset.yaml").write_text((port / "patchset.yaml").read_text().replace('"0.5.11"', '"0.5.23"'))
    target = load_patchset(port)
    with pytest.raises(InputError) as dirty:
        refresh_patchset(target, work)
    assert dirty.value.exit_code == EXIT_USAGE and "uncommitted changes" in str(dirty.value) and DEVICE_CONFIG in str(dirty.value)
    # resolve by hand the way a developer would, then refresh works
    git(work, "checkout", "HEAD", "--", DEVICE_CONFIG)
    cfg = work / DEVICE_CONFIG
    cfg.write_text(cfg.read_text().replace("is_out_of_tree():", "is_out_of_tree() or device == \"ddtree-cpu\":"))
    git(work, "commit", "-q", "-a", "-m", "device config: accept ddtree-cpu")
    # a commit that adds a symlink is refused and nothing is written
    before = snapshot_dir(port)
    (work / "sglang" / "evil.py").symlink_to("/etc/passwd")
    git(work, "add", "sglang/evil.py")
    git(work, "commit", "-q", "-m", "evil")
    with pytest.raises(InputError) as sym:
        refresh_patchset(target, work)
    assert "symlinks (mode 120000) are refused" in str(sym.value) and snapshot_dir(port) == before
    git(work, "reset", "-q", "--hard", "HEAD~1")
    res = refresh_patchset(target, work)
    assert len(res.series) == 2
    assert build_overlay(load_patchset(port), wheel_023).notes == ()


def test_dev_refuses_a_non_empty_directory(wheel_011: WheelBase, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "keep.txt").write_text("mine")
    with pytest.raises(InputError) as err:
        make_dev_tree(load_patchset(PATCHSETS / "moved" / "sglang-0.5.11"), wheel_011, tmp_path / "work")
    assert "not an empty directory" in str(err.value) and (tmp_path / "work" / "keep.txt").read_text() == "mine"


DDTREE_0511 = PATCHSETS.parent.parent / "patches" / "ddtree" / "sglang-0.5.11"


@pytest.mark.skipif(not (DDTREE_0511 / "patchset.yaml").is_file(), reason="patches/ddtree/sglang-0.5.11 not written yet")
def test_real_ddtree_series_round_trips(wheel_011: WheelBase, tmp_path: Path, work_root: Path) -> None:
    """The DDTree series (mail-style patches with From:/Subject: headers) opens and refreshes to the same overlay."""
    shutil.copytree(DDTREE_0511, tmp_path / "ddtree" / "sglang-0.5.11")
    for vendored in ("runtime", "spec-v1"):
        shutil.copytree(DDTREE_0511.parent / vendored, tmp_path / "ddtree" / vendored,
                        ignore=shutil.ignore_patterns("__pycache__"))
    ps = load_patchset(tmp_path / "ddtree" / "sglang-0.5.11")
    original = build_overlay(ps, wheel_011)
    tree = make_dev_tree(ps, wheel_011, work_root / "work")
    subjects = git(tree.path, "log", "--reverse", "--format=%s", f"{BASE_TAG}..HEAD").splitlines()
    assert subjects == [p.subject for p in ps.patches]  # author, subject and message came through git am
    res = refresh_patchset(ps, tree.path)
    assert res.series == ps.series and res.yaml_comments_kept
    refreshed = load_patchset(ps.dir)
    assert refreshed.base_files == ps.base_files
    assert build_overlay(refreshed, wheel_011).digest == original.digest


def test_cli_dev_and_refresh(tmp_path: Path, work_root: Path) -> None:
    import json

    root = tmp_path / "patches"
    root.mkdir()
    copy_family("moved", root)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("patchset", *args, "--patches", str(root), columns=250)

    work = work_root / "cli-work"
    dev = run("dev", "moved", str(work), "--base", "sglang==0.5.11")
    assert dev.returncode == 0, dev.stderr
    assert "1 patch commit(s) of moved/sglang-0.5.11" in dev.stdout
    again = run("dev", "moved", str(work), "--base", "sglang==0.5.11")
    assert again.returncode == EXIT_USAGE and "not an empty directory" in again.stderr
    patch = root / "moved" / "sglang-0.5.11" / "0001-device-config-ddtree-flag.patch"
    before = patch.read_bytes()
    dry = run("refresh", "moved", str(work), "--dry-run")  # what refresh would write, summary first; nothing written
    assert dry.returncode == 0, dry.stderr
    assert "0001-device-config-ddtree-flag.patch" in dry.stdout and "files, +" in dry.stdout
    assert "dry run: nothing was written" in dry.stdout and "@@" not in dry.stdout
    full = run("refresh", "moved", str(work), "--dry-run", "--diff")
    assert "@@" in full.stdout and "+From 0000000000000000000000000000000000000000" in full.stdout
    assert patch.read_bytes() == before
    assert run("refresh", "moved", str(work), "--diff").returncode == EXIT_USAGE  # --diff needs --dry-run
    first = run("refresh", "moved", str(work), "--json")  # bare name: the work tree knows its patch set
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["written"] == ["0001-device-config-ddtree-flag.patch"]  # now in format-patch form
    second = run("refresh", "moved", str(work), "--json")
    assert json.loads(second.stdout)["written"] == [] and not json.loads(second.stdout)["yaml_rewritten"]
    wrong = run("refresh", "sample", str(work))
    assert wrong.returncode == EXIT_USAGE and "was made from moved/sglang-0.5.11" in wrong.stderr
