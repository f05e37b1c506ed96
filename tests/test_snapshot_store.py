"""The snapshot store's on-disk format (ddtree_deploy/snapshot/store.py), on real files: a fresh store says its
format, an entry is committed whole or not at all, a store written before the format had a number is read as it is
and upgraded only when written, a newer format is refused, and blobs lie where their content says.

This is the one test besides store.py that may read the layout directly (it pins format 1). Fast: no sandbox.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import pathlib
import secrets
import subprocess
import sys
import tarfile
import types
from pathlib import Path
from typing import Any

import pytest

from cli_inproc import run_cli
from ddtree_deploy.errors import InputError
from ddtree_deploy.snapshot import FORMAT, SnapshotStore
from ddtree_deploy.snapshot import store as store_mod
from ddtree_deploy.snapshot.manifest import manifest_digest
from ddtree_deploy.snapshot.receiver import receive_blobs

FILES = {"sglang/__init__.py": b"__version__ = '0.5.11'\n", "sglang/version.py": b"v = 1\n",
         "sglang/srt/server_args.py": b"class ServerArgs: ...\n" * 40,
         "sglang-0.5.11.dist-info/METADATA": b"Name: sglang\nVersion: 0.5.11\n"}
FACTS = {"host": "gpu1", "packages": {"sglang": {"version": "0.5.11"}}, "torch": {"status": "ok", "version": "2.9.1"}}


def tree(root: Path) -> dict[str, tuple[bytes | None, int, int]]:
    """Every path under ``root`` with its bytes (None for a directory), mode and mtime: any write changes it."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (None if path.is_dir() else path.read_bytes(), st.st_mode, st.st_mtime_ns)
    return out


def write_format0_entry(root: Path, host: str, files: dict[str, bytes], facts: dict[str, Any], created: dt.datetime,
                        version: str = "0.5.11") -> str:
    """A snapshot written exactly as ddtree-deploy wrote it before the format had a number (take._write_entry and the
    receiver, up to commit e93f19f): read-only blobs under objects/, the entry's three files, no store.json and no
    "format" anywhere. Returns the snapshot id."""
    objects = root / "objects"
    (objects / ".incoming").mkdir(parents=True, exist_ok=True)
    manifest = {}
    for path, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        blob = objects / sha
        if not blob.exists():
            fd = os.open(blob, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            os.write(fd, data)
            os.close(fd)
        manifest[path] = {"sha256": sha, "size": len(data), "mode": 0o644}
    links: dict[str, str] = {}
    digest = manifest_digest(manifest, links)
    snap_id = hashlib.sha256(f"{host}\0{created.isoformat()}\0{digest}\0{secrets.token_hex(8)}".encode()).hexdigest()[:12]
    info = {"id": snap_id, "host": host, "created": created.isoformat(timespec="microseconds"), "package": "sglang",
            "package_version": version, "site_packages": "/venv/lib/python3.11/site-packages",
            "dist_info": f"sglang-{version}.dist-info", "manifest_digest": digest,
            "stats": {"files": len(manifest), "bytes": sum(len(d) for d in files.values())}}
    host_dir = root / host
    host_dir.mkdir(parents=True, exist_ok=True)
    tmp = host_dir / f".tmp-{snap_id}-{os.getpid()}"
    tmp.mkdir()
    (tmp / "facts.json").write_text(json.dumps(facts, indent=1, sort_keys=True))
    (tmp / "manifest.json").write_text(json.dumps({"files": manifest, "links": links, "dist_info": info["dist_info"]},
                                                  separators=(",", ":"), sort_keys=True))
    (tmp / "snapshot.json").write_text(json.dumps(info, indent=1))
    os.rename(tmp, host_dir / snap_id)
    return snap_id


@pytest.fixture
def format0(tmp_path: Path) -> tuple[Path, list[str]]:
    """A format-0 store: two snapshots of gpu1 (the second with one file edited) and one of gpu2."""
    root = tmp_path / "old-store"
    t0 = dt.datetime(2025, 11, 3, 9, 0, tzinfo=dt.timezone.utc)
    ids = [write_format0_entry(root, "gpu1", FILES, FACTS, t0),
           write_format0_entry(root, "gpu1", {**FILES, "sglang/version.py": b"v = 2\n"}, FACTS, t0 + dt.timedelta(hours=1)),
           write_format0_entry(root, "gpu2", FILES, {**FACTS, "host": "gpu2"}, t0 + dt.timedelta(hours=2))]
    (root / ".verified-blobs.json").write_text("{}")
    return root, ids


def read_all(store: SnapshotStore) -> dict[str, Any]:
    """What a reader gets from the store: every snapshot's metadata (less "format"), facts, manifest and blob bytes."""
    out = {}
    for snap in store.list():
        info = {k: v for k, v in snap.info.items() if k != "format"}
        blobs = {p: store.read_blob(e["sha256"], path=p, snapshot_id=snap.id) for p, e in snap.manifest.items()}
        out[snap.id] = {"info": info, "facts": snap.facts, "manifest": snap.manifest, "links": snap.links,
                        "blobs": blobs}
    return out


def commit(store: SnapshotStore, host: str = "gpu1", when: str = "2025-11-04T10:00:00.000000+00:00") -> Any:
    files = {p: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d), "mode": 0o644} for p, d in FILES.items()}
    info = {"id": store.new_id(host, when, manifest_digest(files)), "host": host, "created": when, "package": "sglang",
            "package_version": "0.5.11", "manifest_digest": manifest_digest(files)}
    return store.commit_entry(host, info, FACTS, {"files": files, "links": {}, "dist_info": None})


# -- a fresh store -----------------------------------------------------------------------------------------------------
def test_a_fresh_store_writes_store_json_with_format_1_when_first_written(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    store = SnapshotStore(root)
    assert store.list() == [] and store.latest("gpu1") is None and store.format() == 0
    assert not root.exists()  # reading a store that is not there creates nothing
    snap = commit(store)
    assert json.loads((root / "store.json").read_text()) == {"format": 1} == {"format": FORMAT}
    assert json.loads((root / "gpu1" / snap.id / "snapshot.json").read_text())["format"] == 1
    assert snap.format == 1 and snap.info["format"] == 1
    again = SnapshotStore(root)
    assert again.format() == 1 and [s.id for s in again.list()] == [snap.id] and again.latest("gpu1").format == 1
    assert again.get(snap.id[:6]).facts == FACTS and again.latest("gpu1").manifest == snap.manifest


# -- committing an entry -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fails_at", ["facts.json", "manifest.json", "snapshot.json", "rename"])
def test_commit_entry_is_all_or_nothing(tmp_path: Path, monkeypatch, fails_at: str) -> None:
    store = SnapshotStore(tmp_path / "store")
    first = commit(store, when="2025-11-04T09:00:00.000000+00:00")
    before = tree(store.root / "gpu1")
    real_write, real_rename = pathlib.Path.write_text, os.rename

    def write_text(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        if self.name == fails_at:
            real_write(self, text[: len(text) // 2], *args, **kwargs)  # half of it reached the disk, then the disk filled
            raise OSError(28, "No space left on device")
        return real_write(self, text, *args, **kwargs)

    def rename(src: Any, dst: Any) -> None:
        if fails_at == "rename":
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    monkeypatch.setattr(store_mod.os, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        commit(store)
    monkeypatch.undo()
    assert tree(store.root / "gpu1") == before  # no entry, not even its temporary directory
    assert store.temporaries() == []
    assert [s.id for s in SnapshotStore(store.root).list()] == [first.id]
    later = commit(store)
    assert [s.id for s in SnapshotStore(store.root).list("gpu1")] == [first.id, later.id]


def test_an_entry_left_by_a_killed_writer_is_never_listed_and_swept(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    snap = commit(store)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # exited: no such process any more
    half = store.root / "gpu1" / f".tmp-{'a' * 12}-{dead_pid}"
    half.mkdir()
    (half / "facts.json").write_text("{}")
    stale_blob = store.incoming / f"{dead_pid}-0123456789abcdef"
    stale_blob.write_bytes(b"half a blob")
    mine = store.temporary("job", ".json")
    mine.write_text("{}")  # this process still runs: kept
    assert [s.id for s in store.list()] == [snap.id]
    assert set(store.temporaries()) == {half, stale_blob, mine}
    store.sweep("gpu1")
    assert store.temporaries() == [mine] and [s.id for s in store.list()] == [snap.id]


# -- a store written before the format had a number ------------------------------------------------------------------------
def test_a_format0_store_is_read_as_it_is_without_a_write(format0) -> None:
    root, ids = format0
    before = tree(root)
    store = SnapshotStore(root)
    assert store.format() == 0
    assert [s.id for s in store.list()] == ids and [s.format for s in store.list()] == [0, 0, 0]
    assert store.latest("gpu1").id == ids[1] and store.get("gpu2").id == ids[2] and store.get(ids[0][:5]).id == ids[0]
    got = read_all(store)
    assert got[ids[1]]["blobs"]["sglang/version.py"] == b"v = 2\n" and got[ids[0]]["facts"] == FACTS
    assert store.verify(ids[0]) == [] and store.diff(ids[0], ids[1])["changed"] == ["sglang/version.py"]
    # the read commands, as a user runs them
    listed = run_cli("snapshot", "list", "--store", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ids
    shown = run_cli("snapshot", "show", ids[2], "--store", str(root), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["facts"] == {**FACTS, "host": "gpu2"}
    verified = run_cli("snapshot", "verify", ids[1], "--store", str(root), "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True
    assert tree(root) == before  # not a byte, mode or mtime changed; no store.json


def test_a_format0_store_is_upgraded_in_place_when_first_written(format0) -> None:
    root, ids = format0
    old = read_all(SnapshotStore(root))
    entry_files = {i: {n: (root / h / i / n).read_bytes() for n in ("facts.json", "manifest.json")}
                   for h, i in (("gpu1", ids[0]), ("gpu1", ids[1]), ("gpu2", ids[2]))}
    blobs = {p.name: p.read_bytes() for p in (root / "objects").iterdir() if p.is_file()}
    store = SnapshotStore(root)
    store.open_for_write()
    assert json.loads((root / "store.json").read_text()) == {"format": 1} and store.format() == 1
    for host, snap_id in (("gpu1", ids[0]), ("gpu1", ids[1]), ("gpu2", ids[2])):
        info = json.loads((root / host / snap_id / "snapshot.json").read_text())
        assert info["format"] == 1 and {k: v for k, v in info.items() if k != "format"} == old[snap_id]["info"]
        assert {n: (root / host / snap_id / n).read_bytes() for n in entry_files[snap_id]} == entry_files[snap_id]
    assert {p.name: p.read_bytes() for p in (root / "objects").iterdir() if p.is_file()} == blobs
    assert [p for p in root.rglob("*.tmp")] == []
    upgraded = SnapshotStore(root)
    assert read_all(upgraded) == old and [s.format for s in upgraded.list()] == [1, 1, 1]
    # writing again changes nothing that is there, and a new snapshot sits beside the old ones
    before = tree(root)
    upgraded.open_for_write()
    assert tree(root) == before
    new = commit(upgraded, when="2025-11-05T00:00:00.000000+00:00")
    assert [s.id for s in SnapshotStore(root).list()] == [*ids, new.id]


def test_committing_into_a_format0_store_upgrades_it_first(format0) -> None:
    root, ids = format0
    old = read_all(SnapshotStore(root))
    new = commit(SnapshotStore(root), when="2025-11-05T00:00:00.000000+00:00")
    store = SnapshotStore(root)
    assert store.format() == 1 and [s.format for s in store.list()] == [1, 1, 1, 1]
    assert {k: v for k, v in read_all(store).items() if k != new.id} == old


def test_an_upgrade_cut_short_loses_nothing_and_is_finished_by_the_next_writer(format0, monkeypatch) -> None:
    root, ids = format0
    old = read_all(SnapshotStore(root))
    real_replace, calls = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(store_mod.os, "replace", replace)
    with pytest.raises(OSError, match="Input/output error"):
        SnapshotStore(root).open_for_write()
    monkeypatch.undo()
    assert not (root / "store.json").exists()  # written last: the store still says format 0
    cut = SnapshotStore(root)
    assert cut.format() == 0 and sorted(s.format for s in cut.list()) == [0, 0, 1]
    assert read_all(cut) == old and [p for p in root.rglob("*.tmp")] == []
    SnapshotStore(root).open_for_write()
    done = SnapshotStore(root)
    assert done.format() == 1 and [s.format for s in done.list()] == [1, 1, 1] and read_all(done) == old


# -- a newer format ----------------------------------------------------------------------------------------------------
def test_a_newer_format_is_refused_naming_the_store_and_its_format(format0) -> None:
    root, ids = format0
    (root / "store.json").write_text(json.dumps({"format": FORMAT + 1}))
    before = tree(root)
    for attempt in (lambda s: s.list(), lambda s: s.latest("gpu1"), lambda s: s.get(ids[0]),
                    lambda s: s.blob_path("0" * 64), lambda s: s.open_for_write(),
                    lambda s: s.take(types.SimpleNamespace(name="gpu1"))):  # refused before any host is contacted
        with pytest.raises(InputError) as info:
            attempt(SnapshotStore(root))
        text = str(info.value)
        assert str(root) in text and f"format {FORMAT + 1}" in text and "upgrade ddtree-deploy" in text, text
        assert info.value.exit_code == 2
    listed = run_cli("snapshot", "list", "--store", str(root))
    assert listed.returncode == 2 and f"format {FORMAT + 1}" in listed.stderr and "upgrade ddtree-deploy" in listed.stderr
    assert "Traceback" not in listed.stderr
    assert tree(root) == before


def test_an_entry_of_a_newer_format_is_refused_naming_its_file(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    snap = commit(store)
    info_file = snap.path / "snapshot.json"
    info_file.write_text(json.dumps({**snap.info, "format": FORMAT + 1}))
    with pytest.raises(InputError, match="upgrade ddtree-deploy") as info:
        SnapshotStore(store.root).list()
    assert str(info_file) in str(info.value) and "'format'" in str(info.value)


@pytest.mark.parametrize("text,why", [("{not json", "not valid JSON"), ('{"format": "1"}', "field 'format'"),
                                      ('{"format": 0}', "field 'format'"), ("[1]", "field 'format'")])
def test_a_broken_store_json_is_bad_input_naming_the_file(tmp_path: Path, text: str, why: str) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / "store.json").write_text(text)
    with pytest.raises(InputError, match=why) as info:
        SnapshotStore(root).open_for_write()
    assert str(root / "store.json") in str(info.value) and info.value.exit_code == 2
    assert sorted(p.name for p in root.iterdir()) == ["store.json"]


# -- blobs -------------------------------------------------------------------------------------------------------------
def test_blob_path_is_content_addressed_and_stable(tmp_path: Path) -> None:
    root = tmp_path / "store"
    data = FILES["sglang/srt/server_args.py"]
    sha = hashlib.sha256(data).hexdigest()
    store = SnapshotStore(root)
    where = store.blob_path(sha)
    assert where == root / "objects" / sha  # format 1 pins it; the path is the same before the blob exists
    assert SnapshotStore(root).blob_path(sha) == where and not store.has_blob(sha)
    assert store.blob_path(hashlib.sha256(b"other").hexdigest()) != where
    # the receiver puts a blob at the path the store names, and nowhere else
    store.open_for_write()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        member = tarfile.TarInfo("sglang/a.py")
        member.size = len(data)
        tf.addfile(member, io.BytesIO(data))
    buf.seek(0)
    got = receive_blobs(str(store.incoming), {"sglang/a.py": sha}, {"sglang/a.py": str(store.blob_path(sha))}, buf,
                        sizes={"sglang/a.py": len(data)})
    assert got["stored"] == 1 and store.has_blob(sha) and store.stored_blobs() == {sha}
    assert hashlib.sha256(store.blob_path(sha).read_bytes()).hexdigest() == sha
    assert store.temporaries() == []
    # two snapshots of the same content share the one blob
    a, b = commit(store, "gpu1"), commit(store, "gpu2")
    assert {store.blob_path(a.manifest[p]["sha256"]) for p in FILES} == {store.blob_path(b.manifest[p]["sha256"])
                                                                          for p in FILES}


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "0" * 63, "0" * 65, "F" * 64, ""])
def test_blob_path_refuses_a_name_that_is_not_a_sha256(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match="not a sha256") as info:
        SnapshotStore(tmp_path).blob_path(name)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize("name", ["objects", "store.json", ".hidden", "a/b", ""])
def test_names_the_layout_reserves_cannot_be_hosts(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match="cannot name a snapshot directory"):
        SnapshotStore(tmp_path).entry_dir(name, "a" * 12)


def test_materialized_files_never_get_setuid_or_setgid_from_a_host(tmp_path: Path) -> None:
    """A manifest's mode comes from the host: only its permission bits reach the files made from it."""
    store = SnapshotStore(tmp_path / "store")
    data = FILES["sglang/version.py"]
    sha = hashlib.sha256(data).hexdigest()
    store.open_for_write()
    blob = store.blob_path(sha)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    files = {"sglang/version.py": {"sha256": sha, "size": len(data), "mode": 0o6755}}
    when = "2025-11-04T10:00:00.000000+00:00"
    info = {"id": store.new_id("gpu1", when, manifest_digest(files)), "host": "gpu1", "created": when,
            "package": "sglang", "package_version": "0.5.11", "manifest_digest": manifest_digest(files)}
    snap = store.commit_entry("gpu1", info, FACTS, {"files": files, "links": {}, "dist_info": None})
    written = store.materialize(snap, tmp_path / "out")
    assert written == ["sglang/version.py"]
    mode = (tmp_path / "out" / "sglang/version.py").stat().st_mode & 0o7777
    assert mode == 0o755 and (tmp_path / "out" / "sglang/version.py").read_bytes() == data
