"""Content-addressed snapshots of the SGLang installed on a host: exact bytes, a hash manifest and the host's facts.

Store layout (root: ``--store``, ``$DDTREE_SNAPSHOTS``, the checkout's ``snapshots/`` or ``$XDG_DATA_HOME/ddtree-deploy/snapshots``)::

    objects/<sha256>                 one read-only blob per distinct file content, shared by every host
    objects/.incoming/<pid>-<rand>   blobs being received; renamed into place only once their hash matched
    <host>/<id>/snapshot.json        id, host, created, package version, counts, transfer statistics
    <host>/<id>/facts.json           ddtree_deploy.facts record
    <host>/<id>/manifest.json        {"files": {path: {"sha256", "size", "mode"}}, "links": {path: target}}

Paths in a manifest are relative to site-packages (``sglang/srt/server_args.py``) and cover the package and its
dist-info directory (``__pycache__`` is left out: it is derived, host-specific and rebuilt by every release).

Why it is built this way:

- Only blobs the store lacks cross the wire, as one ``tar`` stream (``zstd -1`` compressed when both ends have zstd:
  paramiko's per-byte cost is the bottleneck). A separate receiver process (stdlib only, its own CPU, out of the
  GIL that paramiko's thread holds) reads the stream, hashes every blob on arrival and renames it into
  ``objects/`` only when it matches the manifest, so a half-received file never looks like a blob. Member names
  are only looked up in the list we asked for, never used as paths.
- The entry directory is written under a temporary name and renamed last, so an interrupted snapshot leaves no
  entry, and the blobs that did arrive are complete and verified (harmless, and reused by the next attempt).
- Hashing on the host is cached in ``<release_root>/.manifest-cache.json`` keyed by (path, size, mtime_ns, inode,
  ctime_ns: an in-place edit that keeps the size and restores the mtime still changes ctime),
  and torch's facts in ``.facts-cache.json`` keyed by the identity of torch's files, so re-snapshotting an unchanged
  host is one host process (manifest and facts together) and stat() calls: about 0.5 s for 0.5.23's 5,800 files
  (bench/results/snapshot-sandbox.md). A first snapshot runs the facts (torch import) on a second channel while
  the manifest is hashed and the blobs transferred.

- The store trusts nothing it did not check: a manifest from a host with a path that leaves the package (``..``,
  absolute, outside the package and its dist-info) is refused before anything is stored; a blob already in the
  store is re-hashed when its stat changed since it was last verified (``.verified-blobs.json``), and a damaged
  one is fetched again by the next snapshot; ``repair`` fetches the damaged blobs of a snapshot from its host;
  ``materialize`` (the patch-set work trees) refuses a blob whose content does not match its hash.

Public API: ``SnapshotStore(root)`` with ``take(host, progress=...)``, ``get(id_or_prefix)``, ``latest(host)``,
``list(host=None)``, ``verify(id)``, ``repair(id, host)``, ``blob_path(sha256)``, ``materialize(snapshot, dest,
paths=None)`` and ``diff(a, b)``; ``Snapshot`` with ``id``, ``host``, ``created``, ``facts``, ``manifest`` and
``package_version``.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import inspect
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import facts as facts_mod
from . import paths
from .errors import InputError, OperationFailed, RemoteError, TransportError
from .inventory import Host
from .transport import HostConnection

#: ``progress(stage, done, total)``: stage is "manifest", "transfer" or "done"; byte counts for "transfer".
Progress = Callable[[str, int, int], None]

_ID_RE = re.compile(r"^[0-9a-f]{12}$")
_RESERVED = {"objects"}
#: Largest path list sent inline in the tar command (base64 of gzip); larger lists are uploaded to a file first.
_INLINE_LIST_LIMIT = 96_000
_READ = 1 << 20


def default_root() -> Path:
    """``$DDTREE_SNAPSHOTS``, else the checkout's ``snapshots/``, else the user data dir (ddtree_deploy.paths)."""
    return paths.snapshot_root()


@dataclass
class SnapshotStats:
    files: int = 0
    bytes: int = 0
    blobs_needed: int = 0
    blobs_transferred: int = 0
    bytes_transferred: int = 0
    seconds: float = 0.0
    manifest_seconds: float = 0.0
    transfer_seconds: float = 0.0
    host_hashed: int = 0
    wire: str = ""  # "tar" or "tar+zstd"
    wire_bytes: int = 0


class Snapshot:
    """One recorded snapshot. ``facts`` and ``manifest`` are read from disk on first use (manifests are large)."""

    def __init__(self, path: Path, info: dict[str, Any]) -> None:
        self.path = path
        self.info = info
        self._facts: dict[str, Any] | None = None
        self._manifest_doc: dict[str, Any] | None = None

    id = property(lambda self: self.info["id"])
    host = property(lambda self: self.info["host"])
    created = property(lambda self: self.info["created"])
    package_version = property(lambda self: self.info.get("package_version"))
    package = property(lambda self: self.info.get("package", "sglang"))

    @property
    def facts(self) -> dict[str, Any]:
        if self._facts is None:
            self._facts = json.loads((self.path / "facts.json").read_text())
        return self._facts

    def _doc(self) -> dict[str, Any]:
        if self._manifest_doc is None:
            self._manifest_doc = json.loads((self.path / "manifest.json").read_text())
        return self._manifest_doc

    @property
    def manifest(self) -> dict[str, dict[str, Any]]:
        """``{path: {"sha256", "size", "mode"}}`` for every regular file, paths relative to site-packages."""
        return self._doc()["files"]

    @property
    def links(self) -> dict[str, str]:
        return self._doc().get("links", {})

    def __repr__(self) -> str:
        return f"Snapshot({self.id} {self.host} {self.package}=={self.package_version} {self.created})"


class SnapshotStore:
    """The local snapshot store shared by all hosts (see the module docstring for its layout)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.objects = self.root / "objects"
        self.incoming = self.objects / ".incoming"

    # -- blobs ---------------------------------------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        return self.objects / sha256

    def has_blob(self, sha256: str) -> bool:
        return (self.objects / sha256).is_file()

    def read_blob(self, sha256: str, *, path: str, snapshot_id: str) -> bytes:
        """The bytes of one blob, checked against its name: a missing or damaged blob is refused (bad input: the
        store), naming the file and the command that mends it. Every reader of base files goes through here."""
        try:
            data = (self.objects / sha256).read_bytes()
        except FileNotFoundError:
            raise InputError(f"snapshot {snapshot_id}: the blob of {path} is missing from the store {self.objects}",
                             hint=f"`ddtree-deploy snapshot verify {snapshot_id} --repair` fetches it again") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise InputError(f"snapshot {snapshot_id}: the blob of {path} does not match its manifest hash (store "
                             "corrupted)", hint=f"`ddtree-deploy snapshot verify {snapshot_id} --repair` fetches it again")
        return data

    def intact_blobs(self, wanted: dict[str, int], *, refresh: bool = False) -> set[str]:
        """Which of ``wanted`` (sha256 -> size) the store holds intact. A blob whose stat (size, mtime, ctime, inode)
        is the one recorded when it was last verified is trusted; any other is re-hashed (``refresh``: all are).
        A damaged blob is removed, so the caller fetches it again."""
        cache = {} if refresh else self._verified()
        good: dict[str, list[int]] = {}
        for sha, size in wanted.items():
            blob = self.objects / sha
            try:
                st = blob.stat()
            except OSError:
                continue
            key = _blob_key(st)
            if cache.get(sha) == key or (st.st_size == size and _hash_path(blob) == sha):
                good[sha] = key
            else:
                blob.unlink(missing_ok=True)
        if any(cache.get(k) != v for k, v in good.items()):
            self._save_verified({**cache, **good})
        return set(good)

    def _verified(self) -> dict[str, list[int]]:
        try:
            return json.loads((self.root / ".verified-blobs.json").read_text())
        except (OSError, ValueError):
            return {}

    def _save_verified(self, cache: dict[str, list[int]]) -> None:
        path = self.root / ".verified-blobs.json"
        tmp = path.with_name(f".verified-blobs.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(cache, separators=(",", ":")))
            tmp.replace(path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a cache we cannot write only costs a re-hash next time

    def _record_verified(self, shas: Iterable[str]) -> None:
        """Blobs the receiver stored were hashed on arrival: record them, so the next snapshot only stats them."""
        cache = self._verified()
        for sha in shas:
            try:
                cache[sha] = _blob_key((self.objects / sha).stat())
            except OSError:
                continue
        self._save_verified(cache)

    def _sweep(self, host_name: str) -> None:
        """Remove what snapshot processes that no longer run left behind (killed mid-transfer or mid-write):
        temporary blobs ``objects/.incoming/<pid>-*`` and temporary entries ``<host>/.tmp-<id>-<pid>``."""
        if self.incoming.is_dir():
            for tmp in self.incoming.iterdir():
                pid = tmp.name.split("-", 1)[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    tmp.unlink(missing_ok=True)
        host_dir = self.root / host_name
        if host_dir.is_dir():
            for tmp in host_dir.glob(".tmp-*"):
                pid = tmp.name.rsplit("-", 1)[-1]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    shutil.rmtree(tmp, ignore_errors=True)

    # -- taking a snapshot -----------------------------------------------------------------------------------------
    def take(self, host: Host, progress: Progress | None = None, *, connection: HostConnection | None = None,
             refresh: bool = False, package: str = "sglang") -> Snapshot:
        """Snapshot ``host``: facts and manifest from the host, missing blobs in one tar stream, entry last.

        ``connection`` lets a caller share an open connection (and its fate: closing it cuts the transfer);
        ``refresh`` ignores the host-side hash and torch caches.
        """
        _check_host_name(host.name)
        if connection is None:
            with HostConnection(host) as conn:
                return self.take(host, progress, connection=conn, refresh=refresh, package=package)
        conn = connection
        report = progress or (lambda stage, done, total: None)
        started = time.monotonic()
        stats = SnapshotStats()
        self.objects.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)
        self._sweep(host.name)
        # Facts need a torch import on the host (seconds) unless the host cached them. A host snapshotted before
        # most likely has that cache: one process then returns manifest and facts together. Otherwise (or if the
        # guess was wrong) facts run on their own channel in a daemon thread while we transfer; a daemon thread, so
        # an interrupted snapshot does not wait for a slow torch import to finish.
        facts_call: _Background | None = None
        host_facts: dict[str, Any] | None = None
        args = {"site_packages": host.site_packages, "package": package, "release_root": host.release_root,
                "refresh": refresh}
        combined = not refresh and self.latest(host.name) is not None
        if not combined:
            facts_call = _Background(facts_mod.gather, host, conn, refresh=refresh, package=package)
        report("manifest", 0, 0)
        t0 = time.monotonic()
        try:
            if combined:
                both = conn.call("facts", "snapshot", **args)
                raw = both["manifest"]
                if both["facts"] is not None:
                    host_facts = facts_mod.finish(both["facts"], host.name)
                else:
                    facts_call = _Background(facts_mod.gather, host, conn, refresh=refresh, package=package)
            else:
                raw = conn.call("facts", "manifest", **args)
        except RemoteError as exc:
            if exc.kind == "missing":
                raise InputError(f"{host.source}: field 'site_packages': {exc}") from exc
            raise
        stats.manifest_seconds = time.monotonic() - t0
        stats.host_hashed = raw.get("hashed", 0)
        check_manifest(host.name, package, raw)
        files = {p: {"sha256": v[0], "size": v[1], "mode": v[2]} for p, v in raw["files"].items()}
        stats.files = len(files)
        stats.bytes = sum(v["size"] for v in files.values())
        wanted: dict[str, str] = {}  # path on the host -> sha256, one path per missing blob
        first = {}
        for path in sorted(files):
            first.setdefault(files[path]["sha256"], path)
        intact = self.intact_blobs({sha: files[path]["size"] for sha, path in first.items()}, refresh=refresh)
        for sha, path in first.items():
            if sha not in intact:
                wanted[path] = sha
        stats.blobs_needed = len(wanted)
        if wanted:
            t1 = time.monotonic()
            self._fetch(conn, host, wanted, {p: files[p]["size"] for p in wanted}, report, stats,
                        host_zstd=bool(raw.get("zstd")))
            stats.transfer_seconds = time.monotonic() - t1
        if facts_call is not None:
            host_facts = facts_call.result()
        assert host_facts is not None
        stats.seconds = time.monotonic() - started
        snap = self._write_entry(host.name, package, host_facts, files, raw.get("links", {}), raw, stats)
        report("done", stats.bytes_transferred, stats.bytes_transferred)
        return snap

    def _fetch(self, conn: HostConnection, host: Host, wanted: dict[str, str], sizes: dict[str, int],
               report: Progress, stats: SnapshotStats, *, host_zstd: bool = False) -> None:
        """Receive ``wanted`` (path -> sha256) as one tar stream, verifying and storing each blob as it arrives.

        When both ends have ``zstd`` the stream is compressed (``zstd -1``, about 3x on SGLang): the SSH layer and
        paramiko's per-packet work are the bottleneck, and zstd costs far less CPU than the bytes it saves.
        """
        total = sum(sizes.values())
        listing = "\0".join(sorted(wanted)).encode()
        packed = base64.b64encode(gzip.compress(listing, 6)).decode()
        site = shlex.quote(host.site_packages)
        local_zstd = shutil.which("zstd") if host_zstd and os.environ.get("DDTREE_SNAPSHOT_ZSTD", "1") != "0" else None
        tar = "tar -c -f - --null --no-recursion --no-unquote -T -"
        squeeze = " | zstd -1 -T0 -q -c" if local_zstd else ""
        stats.wire = "tar+zstd" if local_zstd else "tar"
        cleanup = ""
        if len(packed) <= _INLINE_LIST_LIMIT:
            command = f"cd {site} && printf %s {shlex.quote(packed)} | base64 -d | gzip -dc | {tar}{squeeze}"
        else:  # too long for one command line: upload the list first (one extra round trip)
            remote_list = f"/tmp/.ddtree-snapshot-list-{secrets.token_hex(6)}"
            conn.run(f"cat > {remote_list}", stdin=listing, timeout=60)
            command = (f"cd {site} && {tar.replace('-T -', '-T ' + remote_list)}{squeeze}; rc=$?; rm -f {remote_list}; "
                       "exit $rc")
            cleanup = remote_list
        job_file = self.incoming / f"{os.getpid()}-job-{secrets.token_hex(6)}.json"
        job_file.write_text(json.dumps({"objects": str(self.objects), "incoming": str(self.incoming), "wanted": wanted}))
        # The receiver is a separate Python process: paramiko decrypts in a thread of ours, and per-file work here
        # (open, write, rename: each releases the GIL) would queue behind it. Out of process it runs on its own CPU,
        # which made the first snapshot of 0.5.23 (5,645 blobs) more than twice as fast.
        decompress = None
        if local_zstd:
            decompress = subprocess.Popen([local_zstd, "-dc", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL)
        stored = _StoredBytes()
        receiver = subprocess.Popen([sys.executable, "-I", "-S", "-c", _RECEIVER_PROGRAM, str(job_file), str(stored.fd)],
                                    stdin=decompress.stdout if decompress else subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(stored.fd,))
        stored.started()
        if decompress is not None:
            assert decompress.stdout is not None
            decompress.stdout.close()  # the receiver holds it now; EOF must reach it when zstd exits
        sink = decompress.stdin if decompress is not None else receiver.stdin
        assert sink is not None
        pumped = 0
        cut: BaseException | None = None
        result: dict[str, Any] = {}
        try:
            with _cut_is_transport_error(host.name, lambda: pumped), \
                    conn.stream_out(command, timeout=max(host.command_timeout, 60.0)) as stream:
                # progress counts bytes on the wire; compressed, the wire total is not known in advance, so it counts
                # the bytes the receiver has stored, against the manifest's total (a real total and ETA either way)
                wire_total = 0 if decompress is not None else total
                report("transfer", 0, total)
                last = 0.0
                try:
                    while True:
                        chunk = stream.read(_READ)
                        if not chunk:
                            break
                        sink.write(chunk)
                        pumped += len(chunk)
                        now = time.monotonic()
                        if now - last > 0.05:
                            last = now
                            report("transfer", min(pumped, wire_total) if wire_total else stored.bytes, total)
                except BrokenPipeError:
                    pass  # the receiver stopped early and says why below
                except (TransportError, OSError, EOFError) as exc:
                    cut = exc
                try:
                    sink.close()
                except BrokenPipeError:
                    pass
                receiver.stdin = None  # closed above (when it was the sink); communicate() must not flush it
                if decompress is not None:
                    decompress.wait(timeout=300)
                out, err = receiver.communicate(timeout=300)
                result = _receiver_result(out, err, receiver.returncode)
                if cut is not None or "error" in result:
                    why = f"{cut}" if cut is not None else result["error"]
                    if cut is not None or result.get("kind") == "truncated":
                        raise TransportError(host.name, f"snapshot transfer cut after {pumped} bytes "
                                             f"({result.get('stored', 0)}/{len(wanted)} files stored): {why}")
                    raise OperationFailed(f"host {host.name}: snapshot refused: {why}")
        finally:
            for proc in (decompress, receiver):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            stored.close()
            for tmp in self.incoming.glob(f"{receiver.pid}-*"):
                tmp.unlink(missing_ok=True)
            job_file.unlink(missing_ok=True)
            if cleanup:
                try:
                    conn.run(f"rm -f {cleanup}", timeout=30, check=False)
                except Exception:
                    pass
        stats.blobs_transferred = result["stored"]
        stats.bytes_transferred = result["bytes"]
        self._record_verified(wanted[n] for n in result["names"] if n in wanted)
        stats.wire_bytes = pumped
        lost = sorted(set(wanted) - set(result["names"]))
        if lost:
            raise OperationFailed(f"host {host.name}: {len(lost)} file(s) vanished during the snapshot, e.g. {lost[0]}; "
                                  "is something modifying the installed package? take the snapshot again")

    def _write_entry(self, host_name: str, package: str, host_facts: dict[str, Any], files: dict[str, dict[str, Any]],
                     links: dict[str, str], raw: dict[str, Any], stats: SnapshotStats) -> Snapshot:
        created = _dt.datetime.now(_dt.timezone.utc)
        digest = manifest_digest(files, links)
        snap_id = hashlib.sha256(f"{host_name}\0{created.isoformat()}\0{digest}\0{secrets.token_hex(8)}".encode()).hexdigest()[:12]
        info = {
            "id": snap_id,
            "host": host_name,
            "created": created.isoformat(timespec="microseconds"),
            "package": package,
            "package_version": facts_mod.get(host_facts, f"packages.{package}.version"),
            "site_packages": raw.get("site_packages"),
            "dist_info": raw.get("dist_info"),
            "manifest_digest": digest,
            "stats": stats.__dict__,
        }
        host_dir = self.root / host_name
        host_dir.mkdir(parents=True, exist_ok=True)
        tmp = host_dir / f".tmp-{snap_id}-{os.getpid()}"
        tmp.mkdir()
        try:
            (tmp / "facts.json").write_text(json.dumps(host_facts, indent=1, sort_keys=True))
            (tmp / "manifest.json").write_text(json.dumps({"files": files, "links": links, "dist_info": raw.get("dist_info")},
                                                          separators=(",", ":"), sort_keys=True))
            (tmp / "snapshot.json").write_text(json.dumps(info, indent=1))
            os.rename(tmp, host_dir / snap_id)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return Snapshot(host_dir / snap_id, info)

    # -- reading ---------------------------------------------------------------------------------------------------
    def list(self, host: str | None = None) -> list[Snapshot]:
        """Snapshots, oldest first; only complete entries (temporary directories are never listed)."""
        if not self.root.is_dir():
            return []
        hosts = [self.root / host] if host else [p for p in self.root.iterdir() if p.is_dir() and p.name not in _RESERVED]
        found = []
        for hdir in hosts:
            if not hdir.is_dir():
                continue
            for entry in hdir.iterdir():
                if _ID_RE.match(entry.name) and (entry / "snapshot.json").is_file():
                    found.append(Snapshot(entry, json.loads((entry / "snapshot.json").read_text())))
        return sorted(found, key=lambda s: s.created)

    def latest(self, host_name: str) -> Snapshot | None:
        snaps = self.list(host_name)
        return snaps[-1] if snaps else None

    def get(self, id_or_prefix: str) -> Snapshot:
        """A snapshot by id, unique id prefix (4+ characters), or host name (its latest snapshot)."""
        ref = id_or_prefix.strip()
        every = self.list()
        if ref in {s.host for s in every}:
            return [s for s in every if s.host == ref][-1]
        matches = [s for s in every if s.id.startswith(ref)] if len(ref) >= 4 else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise InputError(f"no snapshot '{ref}' in {self.root} (give an id, a prefix of 4+ characters, or a host name; "
                             "see `ddtree-deploy snapshot list`)")
        raise InputError(f"snapshot prefix '{ref}' is ambiguous in {self.root}: {', '.join(s.id for s in matches[:6])}")

    def verify(self, id_or_prefix: str | Snapshot) -> list[str]:
        """Problems with a snapshot's blobs (missing, wrong size, wrong hash); empty when every blob is intact."""
        snap = id_or_prefix if isinstance(id_or_prefix, Snapshot) else self.get(id_or_prefix)
        problems = []
        checked: set[str] = set()
        for path, entry in sorted(snap.manifest.items()):
            sha = entry["sha256"]
            if sha in checked:
                continue
            checked.add(sha)
            blob = self.blob_path(sha)
            if not blob.is_file():
                problems.append(f"{path}: blob {sha[:16]}… missing from {self.objects}")
                continue
            if blob.stat().st_size != entry["size"]:
                problems.append(f"{path}: blob {sha[:16]}… has {blob.stat().st_size} bytes, manifest says {entry['size']}")
                continue
            if _hash_path(blob) != sha:
                problems.append(f"{path}: blob {sha[:16]}… content does not match its hash (corrupted)")
        return problems

    def repair(self, id_or_prefix: str | Snapshot, host: Host, progress: Progress | None = None) -> dict[str, Any]:
        """Fetch the damaged or missing blobs of a snapshot again from its host (each verified against the
        manifest on arrival: a file that changed on the host since cannot repair the snapshot, and is named)."""
        snap = id_or_prefix if isinstance(id_or_prefix, Snapshot) else self.get(id_or_prefix)
        first: dict[str, str] = {}
        for path, entry in sorted(snap.manifest.items()):
            first.setdefault(entry["sha256"], path)
        sizes = {sha: snap.manifest[path]["size"] for sha, path in first.items()}
        intact = self.intact_blobs(sizes, refresh=True)
        wanted = {path: sha for sha, path in first.items() if sha not in intact}
        if not wanted:
            return {"id": snap.id, "repaired": [], "ok": True}
        self.objects.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)
        stats = SnapshotStats()
        with HostConnection(host) as conn:
            probe = conn.call("facts", "manifest", site_packages=host.site_packages, package=snap.package,
                              release_root=host.release_root)
            try:
                self._fetch(conn, host, wanted, {p: snap.manifest[p]["size"] for p in wanted},
                            progress or (lambda stage, done, total: None), stats, host_zstd=bool(probe.get("zstd")))
            except OperationFailed as exc:
                raise OperationFailed(f"snapshot {snap.id}: cannot repair it from {host.name}: {exc.message}",
                                      hint=f"the host's files differ from the snapshot now; take a new one "
                                           f"(`ddtree-deploy snapshot {host.name}`)") from exc
        return {"id": snap.id, "repaired": sorted(wanted), "ok": not self.verify(snap)}

    def materialize(self, snapshot: Snapshot | str, dest: Path, paths: Iterable[str] | None = None, *,
                    link: bool = False) -> list[str]:
        """Write the snapshot's files (relative to site-packages) into ``dest``; returns the paths written.

        Files are copies with the recorded mode, so the caller may edit them (patch sets do). ``link=True`` hard-links
        the read-only blobs instead: faster, but the files are then read-only and shared with the store.
        """
        snap = snapshot if isinstance(snapshot, Snapshot) else self.get(snapshot)
        manifest = snap.manifest
        selected = sorted(manifest) if paths is None else list(paths)
        dest = Path(dest)
        made_dirs: set[Path] = set()
        for rel in selected:
            if rel not in manifest and rel not in snap.links:
                raise InputError(f"snapshot {snap.id}: no file {rel!r} in its manifest")
            if rel.startswith("/") or ".." in rel.split("/"):
                raise InputError(f"snapshot {snap.id}: refusing path {rel!r} outside the destination")
            target = dest / rel
            if target.parent not in made_dirs:
                target.parent.mkdir(parents=True, exist_ok=True)
                made_dirs.add(target.parent)
            if rel in snap.links:
                target.unlink(missing_ok=True)
                os.symlink(snap.links[rel], target)
                continue
            entry = manifest[rel]
            blob = self.blob_path(entry["sha256"])
            data = self.read_blob(entry["sha256"], path=rel, snapshot_id=snap.id)
            target.unlink(missing_ok=True)
            if link:
                try:
                    os.link(blob, target)
                    continue
                except OSError:  # another filesystem (EXDEV) or no hard links there: copy instead
                    pass
            target.write_bytes(data)
            os.chmod(target, entry["mode"])
        return selected

    def diff(self, a: Snapshot | str, b: Snapshot | str) -> dict[str, Any]:
        """Files added, removed and changed from ``a`` to ``b``, and the facts that differ."""
        sa = a if isinstance(a, Snapshot) else self.get(a)
        sb = b if isinstance(b, Snapshot) else self.get(b)
        ma, mb = sa.manifest, sb.manifest
        changed = sorted(p for p in set(ma) & set(mb) if ma[p]["sha256"] != mb[p]["sha256"] or ma[p]["mode"] != mb[p]["mode"])
        fa = {k: v for k, v in facts_mod.flatten(sa.facts).items() if k not in facts_mod.VOLATILE and k != "host"}
        fb = {k: v for k, v in facts_mod.flatten(sb.facts).items() if k not in facts_mod.VOLATILE and k != "host"}
        facts_diff = {k: {"a": fa.get(k), "b": fb.get(k)} for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}
        return {
            "a": {"id": sa.id, "host": sa.host, "version": sa.package_version},
            "b": {"id": sb.id, "host": sb.host, "version": sb.package_version},
            "added": sorted(set(mb) - set(ma)),
            "removed": sorted(set(ma) - set(mb)),
            "changed": changed,
            "unchanged": len(set(ma) & set(mb)) - len(changed),
            "facts": facts_diff,
        }


class _Background:
    """Run one call in a daemon thread; ``result()`` returns its value or raises its exception."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True, name="ddtree-facts")
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _tar_entries(stream: Any) -> Any:
    """Yield ``(name, typeflag, data)`` for each record of a tar stream (ustar, GNU long names, pax headers).

    A small reader instead of ``tarfile``: the receiver spent most of its time in tarfile's generic header and
    buffer handling (0.8 s of Python for 5,645 members); this keeps the per-member cost at a few slices. Header
    checksums are verified; a stream that ends before the end-of-archive block raises EOFError.
    """
    def exact(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise EOFError(f"stream ended inside a tar record ({len(data)} of {n} bytes)")
        return data

    def pax_records(data: bytes) -> dict[str, str]:
        out, pos = {}, 0
        while pos < len(data):
            space = data.index(b" ", pos)
            length = int(data[pos:space])
            key, _, value = data[space + 1:pos + length - 1].partition(b"=")
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
            pos += length
        return out

    long_name = None
    pax: dict[str, str] = {}
    while True:
        header = stream.read(512)
        if len(header) != 512:
            raise EOFError("stream ended before the end-of-archive block")
        if header == b"\0" * 512:
            return
        recorded = int(header[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
        if recorded != sum(header[:148]) + 256 + sum(header[156:]):
            raise ValueError("corrupt tar header (checksum mismatch)")
        flag = header[156:157]
        field = header[124:136]
        size = int.from_bytes(field[1:], "big") if field[0] & 0x80 else int(field.split(b"\0", 1)[0].strip() or b"0", 8)
        if "size" in pax and flag not in (b"x", b"g", b"L"):
            size = int(pax["size"])
        data = exact(size)
        if size % 512:
            exact(512 - size % 512)
        if flag == b"L":
            long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        if flag == b"x":
            pax = pax_records(data)
            continue
        if flag == b"g":
            continue
        name = header[:100].split(b"\0", 1)[0]
        prefix = header[345:500].split(b"\0", 1)[0] if header[257:263] == b"ustar\0" else b""
        text = (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")
        text = pax.get("path", long_name if long_name is not None else text)
        long_name, pax = None, {}
        yield text, flag, data


def _receive_blobs(objects: str, incoming: str, wanted: dict[str, str], stream: Any,
                   on_stored: Any = None) -> dict[str, Any]:
    """Read a tar stream, storing each wanted regular file as ``objects/<sha256>`` once its hash matched.

    Runs in a child process (stdlib only; see ``_RECEIVER_PROGRAM``). Member names are only looked up in
    ``wanted``, never used as paths, so a hostile or broken host cannot write outside the store. A blob is written
    under ``incoming/<pid>-<random>`` and renamed into place only after verification: a cut stream leaves at most
    that temporary file, which is removed here or, if this process is killed, by the parent.
    """
    import hashlib
    import os
    import secrets

    names: list[str] = []
    total = 0
    for name, flag, data in _tar_entries(stream):
        if flag not in (b"0", b"\0", b"7"):  # regular files only; directories and links were not asked for
            continue
        expected = wanted.get(name)
        if expected is None:
            raise ValueError(f"tar stream held a file that was not asked for: {name!r}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected:
            raise ValueError(f"{name} arrived with sha256 {digest[:16]}..., the manifest says {expected[:16]}...: "
                             "it changed on the host during the snapshot; take it again")
        tmp = os.path.join(incoming, f"{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)  # read-only from birth
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, os.path.join(objects, expected))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        names.append(name)
        total += len(data)
        if on_stored is not None:
            on_stored(total)
    return {"stored": len(names), "bytes": total, "names": names}


_RECEIVER_PROGRAM = ("from __future__ import annotations\nfrom typing import Any\n" + inspect.getsource(_tar_entries)
                     + "\n\n" + inspect.getsource(_receive_blobs) + """
import json, os, sys, time
data = open(0, "rb", buffering=1 << 20, closefd=False)
with open(sys.argv[1]) as fh:
    job = json.load(fh)
_progress_fd, _last = (int(sys.argv[2]) if len(sys.argv) > 2 else None), [0.0]


def _stored(total):
    # bytes of file content stored so far, on the progress pipe (at most every 50 ms): the parent's progress bar
    # has a real total and ETA even when the wire carries compressed bytes
    now = time.monotonic()
    if now - _last[0] >= 0.05:
        _last[0] = now
        try:
            os.write(_progress_fd, b"%d\\n" % total)
        except OSError:
            pass


try:
    result = _receive_blobs(job["objects"], job["incoming"], job["wanted"], data,
                            _stored if _progress_fd is not None else None)
except EOFError as exc:
    result = {"error": "stream ended early: %s" % exc, "kind": "truncated"}
except Exception as exc:
    result = {"error": str(exc), "kind": type(exc).__name__}
sys.stdout.write(json.dumps(result))
""")


class _StoredBytes:
    """The receiver's progress pipe: it writes the running count of stored bytes, a thread here keeps the last."""

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self.bytes = 0
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def started(self) -> None:
        os.close(self.fd)  # the receiver holds the write end now; EOF reaches us when it exits
        self.fd = -1
        self._thread.start()

    def _follow(self) -> None:
        with os.fdopen(self._read, "rb") as fh:
            for line in fh:
                try:
                    self.bytes = int(line)
                except ValueError:
                    continue

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._thread.ident is None:
            os.close(self._read)  # never started: no reader owns the read end
        else:
            self._thread.join(timeout=5)


@contextlib.contextmanager
def _cut_is_transport_error(host_name: str, pumped: Callable[[], int]) -> Any:
    """A tar stream that ends at a file boundary looks complete to tar; the missing exit status then says it was cut."""
    try:
        yield
    except RemoteError as exc:
        if "exit -1" not in str(exc):
            raise
        raise TransportError(host_name, f"snapshot transfer cut after {pumped()} bytes: the SSH channel closed "
                             "before tar finished") from exc


def _receiver_result(out: bytes, err: bytes, code: int | None) -> dict[str, Any]:
    try:
        result = json.loads(out.decode() or "null")
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = err.decode(errors="replace").strip()[-1500:]
        return {"error": f"blob receiver exited {code}: {tail or 'no output'}", "kind": "crash", "stored": 0}
    return result


def manifest_digest(files: dict[str, dict[str, Any]], links: dict[str, str] | None = None) -> str:
    """One sha256 over every path, content hash and mode: equal digests mean byte-identical packages."""
    h = hashlib.sha256()
    for path in sorted(files):
        e = files[path]
        h.update(f"{path}\0{e['sha256']}\0{e['mode']:o}\n".encode())
    for path in sorted(links or {}):
        h.update(f"{path}\0->{links[path]}\n".encode())
    return h.hexdigest()


def _blob_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _hash_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_READ):
            h.update(block)
    return h.hexdigest()


def check_manifest(host_name: str, package: str, raw: dict[str, Any]) -> None:
    """Refuse a manifest from a host whose paths leave the package: absolute, with ``..``, a backslash or NUL, or
    outside ``<package>/`` and its dist-info; and links whose targets leave them. Checked on arrival, before
    anything is stored (a hostile or broken host must not name files the store or a work tree would write)."""
    tops = {package}
    if raw.get("dist_info"):
        tops.add(str(raw["dist_info"]))

    def bad(path: str) -> str | None:
        if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
            return "not a relative path"
        parts = path.split("/")
        if ".." in parts or "." in parts or "" in parts:
            return "has '..', '.' or an empty part"
        if parts[0] not in tops:
            return f"is outside {package}/ and its dist-info"
        return None

    for path in list(raw.get("files", {})) + list(raw.get("links", {})):
        why = bad(path)
        if why:
            raise OperationFailed(f"host {host_name}: its manifest names {path!r}, which {why}; refusing the snapshot "
                                  "(nothing was stored)")
    for path, target in (raw.get("links") or {}).items():
        joined = os.path.normpath(os.path.join(os.path.dirname(path), str(target)))
        if str(target).startswith("/") or bad(joined):
            raise OperationFailed(f"host {host_name}: its manifest has a link {path!r} -> {target!r} that leaves the "
                                  "package; refusing the snapshot (nothing was stored)")


def _check_host_name(name: str) -> None:
    if not name or name in _RESERVED or name.startswith(".") or "/" in name or "\0" in name:
        raise InputError(f"host name {name!r} cannot name a snapshot directory (reserved, hidden or has '/')")


__all__ = ["Snapshot", "SnapshotStore", "SnapshotStats", "Progress", "default_root", "manifest_digest"]
