"""Patch sets on a snapshot taken from a real sandbox host (sshd, SGLang 0.5.11 installed): the production source.

The same series must give the same overlay from the host's snapshot as from the released wheel, a snapshot
object (what the deploy stage holds) works as a base, and a corrupted store blob is caught before any apply.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_inproc import run_cli

from ddtree_deploy.errors import InputError
from ddtree_deploy.patchset.dev import make_dev_tree
from ddtree_deploy.patchset import SnapshotBase, WheelBase, build_overlay, load_patchset, render_diff
from ddtree_deploy.snapshot import SnapshotStore
from ddtree_deploy.wheels import fetch_wheel

PATCHSETS = Path(__file__).resolve().parent / "patchsets"
DEVICE_CONFIG = "sglang/srt/configs/device_config.py"

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def snap_store(sandbox, tmp_path_factory: pytest.TempPathFactory):
    store = SnapshotStore(tmp_path_factory.mktemp("snapshots"))
    snap = store.take(sandbox.base)
    return store, snap


def test_snapshot_and_wheel_give_the_same_overlay(snap_store, tmp_path: Path) -> None:
    store, snap = snap_store
    ps = load_patchset(PATCHSETS / "moved" / "sglang-0.5.11")
    wheel = WheelBase(fetch_wheel("sglang", "0.5.11"))
    base = SnapshotBase(snap.id, store=store)
    assert (base.package, base.version, base.snapshot_id) == ("sglang", "0.5.11", snap.id)
    from_snapshot = build_overlay(ps, base)
    from_wheel = build_overlay(ps, wheel)
    assert from_snapshot.digest == from_wheel.digest
    assert from_snapshot.base_snapshot == snap.id and from_wheel.base_snapshot == ""
    # the deploy stage passes the Snapshot object itself; that works too, and the diff is the same
    assert build_overlay(ps, snap).digest == from_wheel.digest
    assert render_diff(from_snapshot, snap) == render_diff(from_wheel, wheel)
    # dev from a snapshot: the work tree holds the host's package
    tree = make_dev_tree(ps, base, tmp_path / "work")
    assert (tmp_path / "work" / DEVICE_CONFIG).read_bytes() == from_snapshot.files[0].content
    assert tree.applied == ps.series


def test_cli_check_with_snapshot(snap_store) -> None:
    store, snap = snap_store
    env = {**os.environ, "DDTREE_SNAPSHOTS": str(store.root), "DDTREE_PATCHES": str(PATCHSETS)}
    proc = run_cli("patchset", "check", "moved", "--snapshot", snap.host, env=env, columns=250)
    assert proc.returncode == 0, proc.stderr
    assert f"snapshot {snap.id}" in proc.stdout and "applied" in proc.stdout


def test_corrupted_snapshot_blob_is_refused(snap_store, tmp_path: Path) -> None:
    store, snap = snap_store
    ps = load_patchset(PATCHSETS / "moved" / "sglang-0.5.11")
    blob = store.blob_path(snap.manifest[DEVICE_CONFIG]["sha256"])
    original = blob.read_bytes()
    mode = blob.stat().st_mode
    try:
        os.chmod(blob, 0o644)
        blob.write_bytes(original.replace(b"class DeviceConfig", b"class DeviceConfog"))
        with pytest.raises(InputError) as err:
            build_overlay(ps, SnapshotBase(snap.id, store=store))
        assert DEVICE_CONFIG in str(err.value) and "does not match its manifest hash" in str(err.value)
    finally:
        blob.write_bytes(original)
        os.chmod(blob, mode)
