"""Taking a snapshot from a host (and repairing one): facts and manifest from the host, the blobs the store lacks
in one tar stream (``snapshot.transfer``), the entry committed to the store last (``store.commit_entry``).

Facts need a torch import on the host (seconds) unless the host cached them; a host snapshotted before most likely
has that cache, and one host process then returns manifest and facts together. Otherwise facts run on their own
channel in a daemon thread while the blobs are transferred.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from typing import Any, Callable

from .. import facts as facts_mod
from .. import hostpaths
from ..errors import InputError, OperationFailed, RemoteError
from ..inventory import Host
from ..transport import HostConnection
from .local import LocalStore
from .progress import Progress, SnapshotStats
from .manifest import check_manifest, manifest_digest
from .store import Snapshot, check_host_name
from .transfer import fetch_blobs


def take(store: LocalStore, host: Host, progress: Progress | None = None, *, connection: HostConnection | None = None,
         refresh: bool = False, package: str = "sglang") -> Snapshot:
    """Snapshot ``host``: facts and manifest from the host, missing blobs in one tar stream, entry last.

    ``connection`` lets a caller share an open connection (and its fate: closing it cuts the transfer);
    ``refresh`` ignores the host-side hash and torch caches.
    """
    check_host_name(host.name)
    store.format()  # a store of a newer format is refused before the host is contacted
    if connection is None:
        with HostConnection(host) as conn:
            return take(store, host, progress, connection=conn, refresh=refresh, package=package)
    conn = connection
    hostpaths.check(conn, host)  # the host's caches are written into the release root: never inside the package
    report = progress or (lambda stage, done, total: None)
    started = time.monotonic()
    stats = SnapshotStats()
    store.open_for_write()
    store.sweep(host.name)
    # Facts need a torch import on the host (seconds) unless the host cached them. A host snapshotted before
    # most likely has that cache: one process then returns manifest and facts together. Otherwise (or if the
    # guess was wrong) facts run on their own channel in a daemon thread while we transfer; a daemon thread, so
    # an interrupted snapshot does not wait for a slow torch import to finish.
    facts_call: _Background | None = None
    host_facts: dict[str, Any] | None = None
    args = {"site_packages": host.site_packages, "package": package, "release_root": host.release_root,
            "refresh": refresh}
    combined = not refresh and store.latest(host.name) is not None
    if not combined:
        facts_call = _Background(facts_mod.gather, host, conn, refresh=refresh, package=package)
    report("manifest", 0, 0)
    t0 = time.monotonic()
    try:
        if combined:
            both = conn.call("manifest", "snapshot", **args)
            raw = both["manifest"]
            if both["facts"] is not None:
                host_facts = facts_mod.finish(both["facts"], host.name)
            else:
                facts_call = _Background(facts_mod.gather, host, conn, refresh=refresh, package=package)
        else:
            raw = conn.call("manifest", "manifest", **args)
    except RemoteError as exc:
        if exc.kind == "missing":
            raise InputError(f"{host.source}: field 'site_packages': {exc}") from exc
        raise
    stats.manifest_seconds = time.monotonic() - t0
    stats.host_hashed = raw.get("hashed", 0)
    check_manifest(host.name, package, raw)
    files = {p: {"sha256": v[0], "size": v[1], "mode": v[2]} for p, v in raw["files"].items()}
    stats.files = len(files)
    report("manifest", stats.files, 0)  # the manifest's count of files (its bytes follow in the transfer)
    stats.bytes = sum(v["size"] for v in files.values())
    wanted: dict[str, str] = {}  # path on the host -> sha256, one path per missing blob
    first = {}
    for path in sorted(files):
        first.setdefault(files[path]["sha256"], path)
    intact = store.intact_blobs({sha: files[path]["size"] for sha, path in first.items()}, refresh=refresh)
    for sha, path in first.items():
        if sha not in intact:
            wanted[path] = sha
    stats.blobs_needed = len(wanted)
    if wanted:
        t1 = time.monotonic()
        _fetch(store, conn, host, wanted, {p: files[p]["size"] for p in wanted}, report, stats,
                    host_zstd=bool(raw.get("zstd")))
        stats.transfer_seconds = time.monotonic() - t1
    if facts_call is not None:
        host_facts = facts_call.result()
    assert host_facts is not None
    stats.seconds = time.monotonic() - started
    snap = _write_entry(store, host.name, package, host_facts, files, raw.get("links", {}), raw, stats)
    report("done", stats.bytes_transferred, stats.bytes_transferred)
    return snap

def _fetch(store: LocalStore, conn: HostConnection, host: Host, wanted: dict[str, str], sizes: dict[str, int],
           report: Progress, stats: SnapshotStats, *, host_zstd: bool = False) -> None:
    """Receive ``wanted`` (path -> sha256) into the store (``transfer.fetch_blobs``) and remember the stat of
    every blob it stored: they were hashed on arrival."""
    names = fetch_blobs(conn, host, store, wanted, sizes, report, stats, host_zstd=host_zstd)
    store._record_verified(wanted[n] for n in names if n in wanted)


def _write_entry(store: LocalStore, host_name: str, package: str, host_facts: dict[str, Any], files: dict[str, dict[str, Any]],
                 links: dict[str, str], raw: dict[str, Any], stats: SnapshotStats) -> Snapshot:
    created = _dt.datetime.now(_dt.timezone.utc)
    digest = manifest_digest(files, links)
    info = {
        "id": store.new_id(host_name, created.isoformat(), digest),
        "host": host_name,
        "created": created.isoformat(timespec="microseconds"),
        "package": package,
        "package_version": facts_mod.get(host_facts, f"packages.{package}.version"),
        "site_packages": raw.get("site_packages"),
        "dist_info": raw.get("dist_info"),
        "manifest_digest": digest,
        "stats": stats.__dict__,
    }
    return store.commit_entry(host_name, info, host_facts,
                              {"files": files, "links": links, "dist_info": raw.get("dist_info")})


def repair(store: LocalStore, snap: Snapshot, host: Host, progress: Progress | None = None) -> dict[str, Any]:
    """Fetch the damaged or missing blobs of a snapshot again from its host (each verified against the
    manifest on arrival: a file that changed on the host since cannot repair the snapshot, and is named)."""
    store.open_for_write()  # checking removes damaged blobs: a write
    first: dict[str, str] = {}
    for path, entry in sorted(snap.manifest.items()):
        first.setdefault(entry["sha256"], path)
    sizes = {sha: snap.manifest[path]["size"] for sha, path in first.items()}
    intact = store.intact_blobs(sizes, refresh=True)
    wanted = {path: sha for sha, path in first.items() if sha not in intact}
    if not wanted:
        return {"id": snap.id, "repaired": [], "ok": True}
    stats = SnapshotStats()
    with HostConnection(host) as conn:
        probe = conn.call("manifest", "manifest", site_packages=host.site_packages, package=snap.package,
                          release_root=host.release_root)
        try:
            _fetch(store, conn, host, wanted, {p: snap.manifest[p]["size"] for p in wanted},
                        progress or (lambda stage, done, total: None), stats, host_zstd=bool(probe.get("zstd")))
        except OperationFailed as exc:
            raise OperationFailed(f"snapshot {snap.id}: cannot repair it from {host.name}: {exc.message}",
                                  hint=f"the host's files differ from the snapshot now; take a new one "
                                       f"(`ddtree-deploy snapshot {host.name}`)") from exc
    return {"id": snap.id, "repaired": sorted(wanted), "ok": not store.verify(snap)}


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
