"""The built wheel works alone: a fresh venv, no dev extras, any directory (issue 16, item 1).

The patch sets ship as package data (every runtime and base folder the repo's patches/ holds), discovery never
looks at the current directory, and no command writes into it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from wheel_env import REPO, WheelEnv

from ddtree_deploy import __version__


def _shipped_patch_files() -> set[str]:
    """Everything patches/ holds: the runtime, every base folder, every folder a patch set vendors."""
    root = REPO / "patches"
    return {f"ddtree_deploy/_patches/{f.relative_to(root).as_posix()}" for f in root.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"}


def test_wheel_carries_everything_patches_holds(wheel_env: WheelEnv) -> None:
    names = set(zipfile.ZipFile(wheel_env.wheel).namelist())
    expected = _shipped_patch_files()
    assert any("/runtime/" in n for n in expected) and any("/sglang-" in n for n in expected)
    assert expected <= names, sorted(expected - names)[:10]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_installed_cli_starts_from_another_directory(wheel_env: WheelEnv) -> None:
    version = wheel_env.run("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"ddtree-deploy {__version__}"
    for flag in ("--help", "-h"):
        helped = wheel_env.run(flag)
        assert helped.returncode == 0, helped.stderr
        for command in ("apply", "snapshot", "patchset", "probe", "rollback", "hosts"):
            assert command in helped.stdout
    assert list(wheel_env.workdir.iterdir()) == []


def test_installed_patchset_list_shows_the_packaged_patch_sets(wheel_env: WheelEnv) -> None:
    proc = wheel_env.run("patchset", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    expected = sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in (REPO / "patches").glob("*/sglang-*/patchset.yaml"))
    assert sorted(r["name"] for r in rows) == expected and expected
    assert all(r["ok"] for r in rows), rows
    assert all("/site-packages/ddtree_deploy/_patches/" in r["path"] for r in rows)
    table = wheel_env.run("patchset", "list")
    assert table.returncode == 0 and "ddtree/sglang-0.5.11" in table.stdout


def test_a_patches_folder_in_the_cwd_is_not_picked_up(wheel_env: WheelEnv, tmp_path: Path) -> None:
    decoy = tmp_path / "patches" / "decoy" / "sglang-9.9.9"
    decoy.mkdir(parents=True)
    (decoy / "patchset.yaml").write_text("name: decoy\n")
    proc = wheel_env.run("patchset", "list", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "decoy/sglang-9.9.9" not in proc.stdout
    chosen = wheel_env.run("patchset", "list", "--json", cwd=tmp_path, DDTREE_PATCHES=str(tmp_path / "patches"))
    assert "decoy/sglang-9.9.9" in chosen.stdout  # the variable still chooses


def test_store_and_inventory_default_to_user_dirs_never_the_cwd(wheel_env: WheelEnv) -> None:
    snaps = wheel_env.run("snapshot", "list")
    assert snaps.returncode == 0, snaps.stderr
    assert "no snapshots" in snaps.stdout
    hosts = wheel_env.run("hosts", "list")
    assert hosts.returncode == 0, hosts.stderr
    assert str(wheel_env.home / ".config" / "ddtree-deploy" / "hosts") in hosts.stdout.replace("\n", "")
    xdg = wheel_env.run("hosts", "list", XDG_CONFIG_HOME=str(wheel_env.home / "cfg"))
    assert str(wheel_env.home / "cfg" / "ddtree-deploy" / "hosts") in xdg.stdout.replace("\n", "")
    assert list(wheel_env.workdir.iterdir()) == []
