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

from typing import Any

from ..inventory import Host
from ..transport import HostConnection
from .local import LocalStore, default_root
from .manifest import manifest_digest
from .progress import Progress, SnapshotStats
from .store import FORMAT, Snapshot
from .take import repair as _repair
from .take import take as _take


class SnapshotStore(LocalStore):
    """The local snapshot store shared by all hosts: reading (:class:`.local.LocalStore`), taking and repairing
    snapshots (:mod:`.take`); its files and their format are ``store.Store``'s."""

    # -- taking a snapshot (snapshot.take) ---------------------------------------------------------------------------
    def take(self, host: Host, progress: Progress | None = None, *, connection: HostConnection | None = None,
             refresh: bool = False, package: str = "sglang") -> Snapshot:
        """Snapshot ``host``: facts and manifest from the host, missing blobs in one tar stream, entry last.

        ``connection`` lets a caller share an open connection (and its fate: closing it cuts the transfer);
        ``refresh`` ignores the host-side hash and torch caches.
        """
        return _take(self, host, progress, connection=connection, refresh=refresh, package=package)

    def repair(self, id_or_prefix: str | Snapshot, host: Host, progress: Progress | None = None) -> dict[str, Any]:
        """Fetch the damaged or missing blobs of a snapshot again from its host (each verified against the
        manifest on arrival: a file that changed on the host since cannot repair the snapshot, and is named)."""
        return _repair(self, self.get(id_or_prefix) if isinstance(id_or_prefix, str) else id_or_prefix, host, progress)


__all__ = ["FORMAT", "Snapshot", "SnapshotStore", "SnapshotStats", "Progress", "default_root", "manifest_digest"]
