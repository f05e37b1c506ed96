"""Content-addressed snapshots of the SGLang installed on a host: exact bytes, a hash manifest and the host's facts.

The store's files and their numbered format (``FORMAT``: blobs named by their sha256 and shared by every host, one
entry per snapshot with its metadata, facts and manifest) belong to ``store``, the one module that knows them and
draws the layout; older stores are upgraded there the first time they are written, and a store of a newer format is
refused.

Paths in a manifest are relative to site-packages (``sglang/srt/server_args.py``) and cover the package and its
dist-info directory (``__pycache__`` is left out: it is derived, host-specific and rebuilt by every release).

Why it is built this way:

- Only blobs the store lacks cross the wire, as one ``tar`` stream (``zstd -1`` compressed when both ends have zstd:
  paramiko's per-byte cost is the bottleneck). A separate receiver process (stdlib only, its own CPU, out of the
  GIL that paramiko's thread holds) reads the stream, hashes every blob on arrival and renames it to its place in
  the store only when it matches the manifest, so a half-received file never looks like a blob. Member names
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
  store is re-hashed when its stat changed since it was last verified (the store's record of verified blobs), and
  a damaged one is fetched again by the next snapshot; ``repair`` fetches the damaged blobs of a snapshot from its host;
  ``materialize`` (the patch-set work trees) refuses a blob whose content does not match its hash.

The package, by job: this module is the store's public face (reading and checking blobs, lookup, verify,
materialize, diff); ``store`` (the on-disk format: layout, entries, listing, upgrade); ``take``
(taking and repairing a snapshot from a host), ``transfer`` (the tar stream of missing blobs: command, pump,
verdict), ``receiver`` (the blob receiver process), ``manifest`` (digest and the refusal of a hostile manifest).

Public API: ``SnapshotStore(root)`` with ``take(host, progress=...)``, ``get(id_or_prefix)``, ``latest(host)``,
``list(host=None)``, ``verify(id)``, ``repair(id, host)``, ``blob_path(sha256)``, ``materialize(snapshot, dest,
paths=None)`` and ``diff(a, b)``; ``Snapshot`` with ``id``, ``host``, ``created``, ``facts``, ``manifest`` and
``package_version``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import facts as facts_mod
from .. import paths
from ..errors import InputError
from ..inventory import Host
from ..transport import HostConnection
from .manifest import manifest_digest
from .store import FORMAT, Snapshot, Store, blob_key

#: ``progress(stage, done, total)``: stage is "manifest", "transfer" or "done"; byte counts for "transfer".
Progress = Callable[[str, int, int], None]

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


class SnapshotStore(Store):
    """The local snapshot store shared by all hosts; its files and their format are ``store.Store``'s."""

    def __init__(self, root: Path | None = None) -> None:
        super().__init__(Path(root) if root is not None else default_root())

    # -- blobs ---------------------------------------------------------------------------------------------------------
    def read_blob(self, sha256: str, *, path: str, snapshot_id: str) -> bytes:
        """The bytes of one blob, checked against its name: a missing or damaged blob is refused (bad input: the
        store), naming the file and the command that mends it. Every reader of base files goes through here."""
        try:
            data = self.blob_path(sha256).read_bytes()
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
            blob = self.blob_path(sha)
            try:
                st = blob.stat()
            except OSError:
                continue
            key = blob_key(st)
            if cache.get(sha) == key or (st.st_size == size and _hash_path(blob) == sha):
                good[sha] = key
            else:
                blob.unlink(missing_ok=True)
        if any(cache.get(k) != v for k, v in good.items()):
            self._save_verified({**cache, **good})
        return set(good)

    # -- taking a snapshot (snapshot.take) ---------------------------------------------------------------------------
    def take(self, host: Host, progress: Progress | None = None, *, connection: HostConnection | None = None,
             refresh: bool = False, package: str = "sglang") -> Snapshot:
        """Snapshot ``host``: facts and manifest from the host, missing blobs in one tar stream, entry last.

        ``connection`` lets a caller share an open connection (and its fate: closing it cuts the transfer);
        ``refresh`` ignores the host-side hash and torch caches.
        """
        from .take import take

        return take(self, host, progress, connection=connection, refresh=refresh, package=package)

    # -- reading ---------------------------------------------------------------------------------------------------
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
        from .take import repair

        return repair(self, self.get(id_or_prefix) if isinstance(id_or_prefix, str) else id_or_prefix, host, progress)

    def materialize(self, snapshot: Snapshot | str, dest: Path, paths: Iterable[str] | None = None, *,
                    link: bool = False) -> list[str]:
        """Write the snapshot's files (relative to site-packages) into ``dest``; returns the paths written.

        Files are copies with the recorded permission bits (never setuid, setgid or sticky, whatever the host said), so
        the caller may edit them (patch sets do). ``link=True`` hard-links
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
            os.chmod(target, int(entry["mode"]) & 0o777)  # permission bits only: no setuid / setgid from a host
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


def _hash_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_READ):
            h.update(block)
    return h.hexdigest()


__all__ = ["FORMAT", "Snapshot", "SnapshotStore", "SnapshotStats", "Progress", "default_root", "manifest_digest"]
