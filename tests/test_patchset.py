"""Patch sets applied to the real SGLang wheels: exact apply, base checks, failures that name the hunk, --3way.

Fixture patch sets live in tests/patchsets/: ``sample`` (made against 0.5.23 with ``patchset dev`` + ``refresh``),
``moved`` and ``conflict`` (hand-written against 0.5.11, where 0.5.23 changed the code around them). Only the
touched files of each wheel are read, so these tests stay fast.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from cli_inproc import run_cli

from ddtree_deploy.errors import EXIT_PATCH, EXIT_USAGE, PatchDoesNotApply
from ddtree_deploy.patchset import (
    SeriesDoesNotApply,
    WheelBase,
    apply_patchset,
    build_overlay,
    find_patchset_for,
    load_patchset,
    render_diff,
)
from ddtree_deploy.wheels import fetch_wheel

HERE = Path(__file__).resolve().parent
PATCHSETS = HERE / "patchsets"
REPO = HERE.parent
DEVICE_CONFIG = "sglang/srt/configs/device_config.py"
SPEC_REGISTRY = "sglang/srt/speculative/spec_registry.py"


@pytest.fixture(scope="session")
def wheel_023() -> WheelBase:
    return WheelBase(fetch_wheel("sglang", "0.5.23"))


@pytest.fixture(scope="session")
def wheel_011() -> WheelBase:
    return WheelBase(fetch_wheel("sglang", "0.5.11"))


@pytest.fixture
def isolated_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Send every temporary directory of the engine here, so a test can see that nothing was left behind."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def sample():
    return load_patchset(PATCHSETS / "sample" / "sglang-0.5.23")


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env={**os.environ, "DDTREE_PATCHES": str(PATCHSETS)}, columns=250)


# -- the sample applies ------------------------------------------------------------------------------------------------
def test_sample_series_applies_to_its_base(wheel_023: WheelBase) -> None:
    ps = sample()
    result = apply_patchset(ps, wheel_023)
    ov = result.overlay
    assert [s.status for s in result.steps] == ["applied", "applied"]
    assert result.warnings == [] and ov.notes == ()
    assert (ov.package, ov.patchset, ov.patchset_version, ov.base_version, ov.base_snapshot) == \
        ("sglang", "sample/sglang-0.5.23", "0.1.0", "0.5.23", "")
    by_path = {f.path: f for f in ov.files}
    runtime = PATCHSETS / "sample" / "runtime"
    assert {p: f.action for p, f in by_path.items()} == {
        DEVICE_CONFIG: "replace",
        SPEC_REGISTRY: "replace",
        "sglang/srt/speculative/ddtree_sample_hook.py": "add",
        "sglang/srt/speculative/ddtree_sample/__init__.py": "add",
        "sglang/srt/speculative/ddtree_sample/kernels/__init__.py": "add",
        "sglang/srt/speculative/ddtree_sample/kernels/tree.py": "add",
    }
    # The replaced file is the base file with exactly the patch's lines added, nothing else touched.
    old = wheel_023.read(SPEC_REGISTRY).decode().splitlines(keepends=True)
    new = by_path[SPEC_REGISTRY].content.decode().splitlines(keepends=True)
    inserted = ["\n", "    def is_ddtree(self) -> bool:\n",
                "        # DDTree (sample patch set): plugin algorithms are never DDTree.\n", "        return False\n"]
    at = next(i for i in range(len(old)) if new[i] != old[i])
    assert len(new) == len(old) + 4 and new[:at] == old[:at] and new[at + 4:] == old[at:]
    assert sorted(new[at:at + 4]) == sorted(inserted)
    # Runtime files are copied whole; modes follow the base.
    assert by_path["sglang/srt/speculative/ddtree_sample/kernels/tree.py"].content == (runtime / "kernels" / "tree.py").read_bytes()
    assert by_path[SPEC_REGISTRY].mode == wheel_023.mode(SPEC_REGISTRY)
    assert by_path[SPEC_REGISTRY].sha256 == hashlib.sha256(by_path[SPEC_REGISTRY].content).hexdigest()
    # Same inputs, same overlay.
    assert build_overlay(ps, wheel_023).digest == ov.digest


def test_dry_run_diff_reapplies_to_the_base(wheel_023: WheelBase, tmp_path: Path) -> None:
    """render_diff output is a real patch: git apply on the base files reproduces every overlay file."""
    ov = build_overlay(sample(), wheel_023)
    text = render_diff(ov, wheel_023)
    assert f"diff --git a/{DEVICE_CONFIG} b/{DEVICE_CONFIG}\n" in text
    assert "+DDTREE_DEVICES = (\"cuda\", \"cpu\")\n" in text
    assert "new file mode 100644\n--- /dev/null\n+++ b/sglang/srt/speculative/ddtree_sample/kernels/tree.py\n" in text
    wheel_023.materialize(tmp_path, [f.path for f in ov.files if f.action == "replace"])
    (tmp_path / "d.patch").write_text(text)
    proc = subprocess.run(["git", "apply", "-p1", "--unsafe-paths", "d.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for f in ov.files:
        assert (tmp_path / f.path).read_bytes() == f.content, f.path


def test_find_patchset_for_picks_by_base_version() -> None:
    assert find_patchset_for("sample", "0.5.23", root=PATCHSETS).qualified_name == "sample/sglang-0.5.23"
    with pytest.raises(PatchDoesNotApply) as err:
        find_patchset_for("sample", "0.5.11", root=PATCHSETS)
    assert err.value.exit_code == EXIT_PATCH and "0.5.23" in str(err.value)
    drift = find_patchset_for("moved", "0.5.23", root=PATCHSETS, allow_drift=True)
    assert drift.base_version == "0.5.11"
    assert load_patchset("sample/sglang-0.5.23", root=PATCHSETS).yaml_path == sample().yaml_path


# -- the base is checked first -------------------------------------------------------------------------------------------
def test_series_for_another_version_is_refused(wheel_011: WheelBase, wheel_023: WheelBase) -> None:
    with pytest.raises(PatchDoesNotApply) as err:
        build_overlay(sample(), wheel_011)
    msg = str(err.value)
    assert err.value.exit_code == EXIT_PATCH
    assert "made for sglang 0.5.23" in msg and "is sglang 0.5.11" in msg and "--allow-base-drift" in msg
    with pytest.raises(PatchDoesNotApply):
        build_overlay(load_patchset(PATCHSETS / "moved" / "sglang-0.5.11"), wheel_023)


def test_allow_base_drift_reports_loudly(wheel_023: WheelBase, wheel_011: WheelBase) -> None:
    moved = load_patchset(PATCHSETS / "moved" / "sglang-0.5.11")
    result = apply_patchset(moved, wheel_023, allow_base_drift=True, three_way=True)
    notes = "\n".join(result.overlay.notes)
    assert "BASE DRIFT" in notes and "made for sglang 0.5.11" in notes and "is sglang 0.5.23" in notes
    # the hash mismatch is reported with the file, the expected and the found hash
    assert f"{DEVICE_CONFIG}: expected sha256 {moved.base_files[DEVICE_CONFIG]}, found {wheel_023.sha256(DEVICE_CONFIG)}" in notes
    assert result.warnings and all(w in result.overlay.notes for w in result.warnings)
    # a drifted run that fails still says it was drifted
    with pytest.raises(SeriesDoesNotApply) as err:
        build_overlay(sample(), wheel_011, allow_base_drift=True)
    assert str(err.value).startswith("BASE DRIFT")


def test_base_file_hash_mismatch_names_file_and_hashes(wheel_023: WheelBase, tmp_path: Path) -> None:
    work = tmp_path / "sample"
    shutil.copytree(PATCHSETS / "sample", work)
    yml = work / "sglang-0.5.23" / "patchset.yaml"
    good = wheel_023.sha256(DEVICE_CONFIG)
    wrong = hashlib.sha256(b"another build").hexdigest()
    yml.write_text(yml.read_text().replace(good, wrong))
    with pytest.raises(SeriesDoesNotApply) as err:
        build_overlay(load_patchset(yml), wheel_023)
    assert err.value.exit_code == EXIT_PATCH
    assert f"{DEVICE_CONFIG}: expected sha256 {wrong}, found {good}" in str(err.value)
    assert err.value.details["mismatches"] == [{"file": DEVICE_CONFIG, "expected": wrong, "found": good}]


# -- failures name the hunk and produce nothing --------------------------------------------------------------------------
def test_conflicting_hunk_reports_patch_file_hunk_and_produces_nothing(wheel_023: WheelBase, isolated_tmp: Path) -> None:
    ps = load_patchset(PATCHSETS / "conflict" / "sglang-0.5.11")
    with pytest.raises(SeriesDoesNotApply) as err:
        apply_patchset(ps, wheel_023, allow_base_drift=True)
    exc = err.value
    d = exc.details
    assert exc.exit_code == EXIT_PATCH
    assert d["patch"] == "0002-device-config-accept-ddtree.patch"
    assert d["file"] == DEVICE_CONFIG
    assert d["hunk"] == "@@ -13,7 +13,7 @@ class DeviceConfig:"
    assert d["expected"][3] == "        if device in SUPPORTED_DEVICES:"
    # the lines actually there: upstream's changed line, found two lines further down (0.5.23 added an import)
    assert d["found_start"] == 15 and d["found"][3] == "        if device in SUPPORTED_DEVICES or current_platform.is_out_of_tree():"
    assert d["equal_lines"] == 6 and d["first_difference"] == 3
    assert [s["status"] for s in d["steps"]] == ["applied", "failed"]  # 0001 applied in staging, then discarded
    msg = str(exc)
    for needle in ("0002-device-config-accept-ddtree.patch", DEVICE_CONFIG, "@@ -13,7 +13,7 @@",
                   "nothing was produced", "first difference"):
        assert needle in msg
    assert list(isolated_tmp.iterdir()) == []  # the staging copy is gone


def test_three_way_resolves_moved_context_and_is_reported(wheel_023: WheelBase, wheel_011: WheelBase) -> None:
    moved = load_patchset(PATCHSETS / "moved" / "sglang-0.5.11")
    with pytest.raises(SeriesDoesNotApply) as plain:
        build_overlay(moved, wheel_023, allow_base_drift=True)
    assert plain.value.details["hunk"].startswith("@@ -11,6 +11,7 @@")
    result = apply_patchset(moved, wheel_023, allow_base_drift=True, three_way=True)
    assert [s.status for s in result.steps] == ["3-way"]
    assert any(n.startswith("--3way used: 0001-device-config-ddtree-flag.patch") for n in result.overlay.notes)
    # The merge keeps upstream's change and adds ours: exactly the 0.5.23 file plus one line.
    want = wheel_023.read(DEVICE_CONFIG).decode().replace(
        "    gpu_id: Optional[int]\n", "    gpu_id: Optional[int]\n    ddtree_enabled: bool = False\n", 1)
    (f,) = result.overlay.files
    assert f.content.decode() == want
    # On its own base the same series applies exactly: no 3-way, no notes.
    exact = apply_patchset(moved, wheel_011, three_way=True)
    assert [s.status for s in exact.steps] == ["applied"] and exact.overlay.notes == ()


def test_three_way_conflict_still_fails(wheel_023: WheelBase, isolated_tmp: Path) -> None:
    ps = load_patchset(PATCHSETS / "conflict" / "sglang-0.5.11")
    with pytest.raises(SeriesDoesNotApply) as err:
        build_overlay(ps, wheel_023, allow_base_drift=True, three_way=True)
    assert err.value.details["three_way"]["conflicts"] == [DEVICE_CONFIG]
    assert "--3way: also failed: conflicts in " + DEVICE_CONFIG in str(err.value)
    assert list(isolated_tmp.iterdir()) == []


def test_new_file_that_the_base_already_has_is_refused(wheel_023: WheelBase, tmp_path: Path) -> None:
    work = tmp_path / "dup"
    shutil.copytree(PATCHSETS / "sample", work)
    pdir = work / "sglang-0.5.23"
    patch = next(pdir.glob("0002-*.patch"))
    # make 0002 create a file that 0.5.23 already ships
    patch.write_text(patch.read_text().replace("sglang/srt/speculative/ddtree_sample_hook.py",
                                               "sglang/srt/speculative/dflash_dp.py"))
    with pytest.raises(SeriesDoesNotApply) as err:
        build_overlay(load_patchset(pdir), wheel_023)
    assert "sglang/srt/speculative/dflash_dp.py" in str(err.value) and "already has that file" in str(err.value)


# -- the command line ----------------------------------------------------------------------------------------------------
def test_cli_check_diff_and_exit_codes(wheel_023: WheelBase) -> None:
    ok = cli("patchset", "check", "sample", "--base", "sglang==0.5.23", "--json")
    assert ok.returncode == 0, ok.stderr
    import json

    doc = json.loads(ok.stdout)
    assert doc["ok"] and doc["overlay"]["digest"] == build_overlay(sample(), wheel_023).digest
    bad = cli("patchset", "check", "conflict/sglang-0.5.11", "--base", "sglang==0.5.23", "--allow-base-drift")
    assert bad.returncode == EXIT_PATCH
    assert "0002-device-config-accept-ddtree.patch" in bad.stderr and "@@ -13,7 +13,7 @@ class DeviceConfig:" in bad.stderr
    assert "Optional[int]" in bad.stderr  # brackets in code survive the console
    bad_json = cli("patchset", "check", "conflict/sglang-0.5.11", "--base", "sglang==0.5.23", "--allow-base-drift", "--json")
    report = json.loads(bad_json.stdout)
    assert bad_json.returncode == EXIT_PATCH and report["ok"] is False
    assert (report["details"]["patch"], report["details"]["hunk"]) == ("0002-device-config-accept-ddtree.patch",
                                                                       "@@ -13,7 +13,7 @@ class DeviceConfig:")
    assert report["details"]["warnings"][0].startswith("BASE DRIFT")
    drift = cli("patchset", "check", "moved/sglang-0.5.11", "--base", "sglang==0.5.23")
    assert drift.returncode == EXIT_PATCH and "BASE DRIFT" in drift.stderr
    three = cli("patchset", "check", "moved/sglang-0.5.11", "--base", "sglang==0.5.23", "--allow-base-drift", "--3way")
    assert three.returncode == 0 and "3-way" in three.stdout and "--3way used" in three.stderr and "BASE DRIFT" in three.stderr
    diff = cli("patchset", "diff", "sample", "--base", "sglang==0.5.23")
    assert diff.returncode == 0 and diff.stdout == render_diff(build_overlay(sample(), wheel_023), wheel_023)
    hostile = cli("patchset", "check", "hostile-dotdot/sglang-0.5.23", "--base", "sglang==0.5.23")
    assert hostile.returncode == EXIT_USAGE and "leaves the sglang package" in hostile.stderr
    listed = cli("patchset", "list", "--json")
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["sample/sglang-0.5.23"]["ok"] and not rows["hostile-symlink/sglang-0.5.23"]["ok"]



# -- the real DDTree patch set -------------------------------------------------------------------------------------------
DDTREE_0511 = REPO / "patches" / "ddtree" / "sglang-0.5.11" / "patchset.yaml"


@pytest.mark.skipif(not DDTREE_0511.is_file(), reason=f"{DDTREE_0511.relative_to(REPO)} not written yet (another engineer's work)")
def test_ddtree_patchset_checks_against_the_real_0511_wheel(wheel_011: WheelBase) -> None:
    ps = load_patchset(DDTREE_0511)
    assert ps.qualified_name == "ddtree/sglang-0.5.11" and ps.base_version == "0.5.11"
    result = apply_patchset(ps, wheel_011)
    assert [s.status for s in result.steps] == ["applied"] * len(ps.patches) and result.overlay.notes == ()
    paths = {f.path for f in result.overlay.files}
    assert {d for d, _ in ps.runtime.files} <= paths  # the vendored runtime is in the overlay
    assert set(ps.base_files) <= paths  # every hashed base file is really changed
    for f in result.overlay.files:  # every patched or vendored Python file still compiles
        if f.path.endswith(".py"):
            compile(f.content, f.path, "exec")
    proc = cli("patchset", "check", "ddtree", "--base", "sglang==0.5.11", "--patches", str(REPO / "patches"))
    assert proc.returncode == 0, proc.stderr
