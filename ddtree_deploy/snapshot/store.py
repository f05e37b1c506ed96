"""The snapshot store's on-disk format: the one module that knows where things lie under the store's root.

Format 1 (root: ``--store``, ``$DDTREE_SNAPSHOTS``, the checkout's ``snapshots/`` or
``$XDG_DATA_HOME/ddtree-deploy/snapshots``)::

    store.json                       {"format": 1}: the format of everything below
    objects/<sha256>                 one read-only blob per distinct file content, shared by every host
    objects/.incoming/<pid>-...      blobs being received and the receiver's job files, named by the process that
                                     writes them; renamed into place only once their hash matched
    .verified-blobs.json             sha256 -> [size, mtime_ns, ctime_ns, inode] of each blob when it was last hashed
    <host>/<id>/snapshot.json        format, id, host, created, package, package version, digest, transfer statistics
    <host>/<id>/facts.json           ddtree_deploy.facts record
    <host>/<id>/manifest.json        {"files": {path: {"sha256", "size", "mode"}}, "links": {path: target}, "dist_info"}
    <host>/.tmp-<id>-<pid>/          an entry being written (``commit_entry``), renamed to ``<id>`` once complete

``<id>`` is 12 hex digits; a host name is never ``objects`` or ``store.json``, never hidden.

Format 0 is the same layout without ``store.json`` and without ``"format"`` in ``snapshot.json``: the stores written
before the format had a number. It is read as it is, writing nothing (``--dry-run`` and the read commands leave it
alone), and upgraded in place the first time the store is opened for writing (``open_for_write``): ``"format": 1``
added to every entry's ``snapshot.json`` (each file replaced atomically), ``store.json`` written last, so an
interrupted upgrade is redone by the next one and loses nothing. A store whose ``store.json`` names a format newer
than ``FORMAT`` is refused, for reading and for writing (exit 2: a newer ddtree-deploy wrote it).

Everything else reaches the disk through here: ``take`` commits entries with ``commit_entry``, ``transfer`` and
``receiver`` put blobs at the paths ``blob_path`` gives and their temporaries where ``temporary`` says. A change of
format is a change of this module and of tests/test_snapshot_store.py, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError

#: The format this code writes, and the newest it reads.
FORMAT = 1
STORE_FILE = "store.json"

_OBJECTS = "objects"
_INCOMING = ".incoming"
_VERIFIED = ".verified-blobs.json"
_INFO = "snapshot.json"
_FACTS = "facts.json"
_MANIFEST = "manifest.json"
_ID_RE = re.compile(r"^[0-9a-f]{12}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
#: Names under the root that are not host directories.
RESERVED = frozenset({_OBJECTS, STORE_FILE})


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
    #: The entry's format (0: written before the format had a number; read the same way as format 1).
    format = property(lambda self: self.info.get("format", 0))

    @property
    def store_root(self) -> Path:
        """The root of the store that holds this snapshot."""
        return self.path.parent.parent

    @property
    def facts(self) -> dict[str, Any]:
        if self._facts is None:
            self._facts = json.loads((self.path / _FACTS).read_text())
        return self._facts

    def _doc(self) -> dict[str, Any]:
        if self._manifest_doc is None:
            self._manifest_doc = json.loads((self.path / _MANIFEST).read_text())
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


class Store:
    """The store's files under ``root``: its format, blobs, temporaries, the verified-blob record and entries.

    Reading never writes; ``open_for_write`` (called by every writer before its first write) creates the store or
    upgrades an older format in place.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / _OBJECTS
        self.incoming = self.objects / _INCOMING
        self._format: int | None = None  # the format read from store.json (0: none there yet), once checked

    # -- the format ----------------------------------------------------------------------------------------------------
    @property
    def store_file(self) -> Path:
        return self.root / STORE_FILE

    def format(self, *, fresh: bool = False) -> int:
        """The store's format: ``store.json``'s number, 0 for a store without one (format 0, or no store yet); read
        once (``fresh``: again). A ``store.json`` that cannot be read, or names a format newer than ``FORMAT``, is
        refused (InputError)."""
        if self._format is not None and not fresh:
            return self._format
        path = self.store_file
        try:
            text = path.read_text()
        except FileNotFoundError:
            self._format = 0
            return 0
        except OSError as exc:
            raise InputError(f"snapshot store {self.root}: cannot read {path}: {exc.strerror}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})",
                             hint=f"it should hold {json.dumps({'format': FORMAT})}") from None
        found = doc.get("format") if isinstance(doc, dict) else None
        if isinstance(found, bool) or not isinstance(found, int) or found < 1:
            raise InputError(f"{path}: field 'format': expected a whole number from 1, found {found!r}",
                             hint=f"it should hold {json.dumps({'format': FORMAT})}")
        if found > FORMAT:
            raise InputError(f"snapshot store {self.root} has format {found} ({path}), newer than this ddtree-deploy "
                             f"knows (format {FORMAT}): upgrade ddtree-deploy to use it",
                             hint="a newer ddtree-deploy wrote this store; this one neither reads nor writes it")
        self._format = found
        return found

    def open_for_write(self) -> None:
        """Make the store ready to be written: refuse a newer format, create what is missing, and upgrade a store
        of format 0 in place (``migrate``). Idempotent; cheap once the store is at FORMAT."""
        fmt = self.format(fresh=self._format != FORMAT)  # another process may have created or upgraded it meanwhile
        self.incoming.mkdir(parents=True, exist_ok=True)
        if fmt < FORMAT:
            self.migrate()

    def migrate(self) -> list[str]:
        """Upgrade a format-0 store to FORMAT in place; returns the ids of the entries rewritten.

        Each entry's ``snapshot.json`` gains ``"format"`` (written beside it and renamed over it: a reader sees the
        old file or the new one, never half of one); ``store.json`` is written last, so a migration cut short
        leaves a format-0 store that the next writer upgrades again. Entries written since by an older
        ddtree-deploy (no ``"format"``) are read as format 1 too: the layout is the same."""
        if self.format() >= FORMAT:
            return []
        upgraded = []
        for entry, info in self._entries(None):
            if "format" not in info:
                _write_atomic(entry / _INFO, _info_text({"format": FORMAT, **info}))
                upgraded.append(str(info.get("id", entry.name)))
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.store_file, json.dumps({"format": FORMAT}) + "\n")
        self._format = FORMAT
        return upgraded

    # -- blobs ---------------------------------------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        """Where the blob of content ``sha256`` lies (whether or not the store holds it). A name that is not a
        sha256 (64 lowercase hex digits) is refused: it could name a path outside the store."""
        self.format()
        if not is_sha256(sha256):
            raise InputError(f"snapshot store {self.root}: {str(sha256)[:80]!r} is not a sha256 (64 hex digits), so "
                             "not the name of a blob")
        return self.objects / sha256

    def has_blob(self, sha256: str) -> bool:
        return self.blob_path(sha256).is_file()

    def stored_blobs(self) -> set[str]:
        """The sha256 of every blob the store holds (temporaries excluded)."""
        self.format()
        if not self.objects.is_dir():
            return set()
        return {p.name for p in self.objects.iterdir() if p.is_file()}

    def temporary(self, label: str, suffix: str = "") -> Path:
        """A fresh name for a temporary file of this process (``<pid>-<label>-<random><suffix>`` in the incoming
        directory): ``sweep`` removes it once this process is gone."""
        return self.incoming / f"{os.getpid()}-{label}-{secrets.token_hex(6)}{suffix}"

    def remove_temporaries(self, pid: int) -> None:
        """Remove the temporaries of process ``pid`` (the receiver names its own ``<pid>-<random>``)."""
        if self.incoming.is_dir():
            for tmp in self.incoming.glob(f"{pid}-*"):
                tmp.unlink(missing_ok=True)

    def temporaries(self) -> list[Path]:
        """What writers left (or are writing): temporary blobs and job files, and entries not yet renamed."""
        found = sorted(self.incoming.iterdir()) if self.incoming.is_dir() else []
        if self.root.is_dir():
            for hdir in self._host_dirs(None):
                found += sorted(hdir.glob(".tmp-*"))
        return found

    # -- the record of verified blobs ----------------------------------------------------------------------------------
    def _verified(self) -> dict[str, list[int]]:
        try:
            return json.loads((self.root / _VERIFIED).read_text())
        except (OSError, ValueError):
            return {}

    def _save_verified(self, cache: dict[str, list[int]]) -> None:
        path = self.root / _VERIFIED
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
                cache[sha] = blob_key(self.blob_path(sha).stat())
            except OSError:
                continue
        self._save_verified(cache)

    # -- entries -------------------------------------------------------------------------------------------------------
    def entry_dir(self, host_name: str, snap_id: str) -> Path:
        """The directory of snapshot ``snap_id`` of host ``host_name``."""
        check_host_name(host_name)
        if not _ID_RE.match(snap_id):
            raise ValueError(f"snapshot id {snap_id!r} is not 12 hex digits")
        return self.root / host_name / snap_id

    @staticmethod
    def new_id(host_name: str, created: str, digest: str) -> str:
        """A new snapshot id: 12 hex digits of the host, the time, the manifest digest and some randomness."""
        return hashlib.sha256(f"{host_name}\0{created}\0{digest}\0{secrets.token_hex(8)}".encode()).hexdigest()[:12]

    def commit_entry(self, host_name: str, info: dict[str, Any], facts: dict[str, Any],
                     manifest: dict[str, Any]) -> Snapshot:
        """Record a snapshot: ``info`` (its ``id`` and metadata; ``"format"`` is added), ``facts`` and ``manifest``
        (``files``, ``links``, ``dist_info``). Written under a temporary name and renamed last, so a failure at any
        point leaves no entry (the temporary is removed here, or by ``sweep`` if this process is killed)."""
        self.open_for_write()
        final = self.entry_dir(host_name, str(info["id"]))
        info = {"format": FORMAT, **info}
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
        tmp.mkdir()
        try:
            (tmp / _FACTS).write_text(json.dumps(facts, indent=1, sort_keys=True))
            (tmp / _MANIFEST).write_text(json.dumps(manifest, separators=(",", ":"), sort_keys=True))
            (tmp / _INFO).write_text(_info_text(info))
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return Snapshot(final, info)

    def list(self, host: str | None = None) -> list[Snapshot]:
        """Snapshots, oldest first; only complete entries (temporary directories are never listed)."""
        return sorted((Snapshot(entry, info) for entry, info in self._entries(host)), key=lambda s: s.created)

    def latest(self, host_name: str) -> Snapshot | None:
        snaps = self.list(host_name)
        return snaps[-1] if snaps else None

    def _host_dirs(self, host: str | None) -> list[Path]:
        if host:
            return [self.root / host]
        return [p for p in self.root.iterdir() if p.is_dir() and p.name not in RESERVED and not p.name.startswith(".")]

    def _entries(self, host: str | None) -> list[tuple[Path, dict[str, Any]]]:
        """``(directory, snapshot.json)`` of every complete entry (of ``host``), in no order."""
        self.format()
        if not self.root.is_dir():
            return []
        found = []
        for hdir in self._host_dirs(host):
            if not hdir.is_dir():
                continue
            for entry in hdir.iterdir():
                if _ID_RE.match(entry.name) and (entry / _INFO).is_file():
                    found.append((entry, self._read_info(entry / _INFO)))
        return found

    def _read_info(self, path: Path) -> dict[str, Any]:
        info = json.loads(path.read_text())
        fmt = info.get("format", 0)
        if isinstance(fmt, int) and fmt > FORMAT:
            raise InputError(f"{path}: field 'format': {fmt}, newer than this ddtree-deploy knows (format {FORMAT}): "
                             "upgrade ddtree-deploy to read this snapshot")
        return info

    def sweep(self, host_name: str) -> None:
        """Remove what snapshot processes that no longer run left behind (killed mid-transfer or mid-write):
        temporaries in the incoming directory and entries of ``host_name`` not yet renamed."""
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


def blob_key(st: os.stat_result) -> list[int]:
    """What the verified-blob record keeps of a blob's stat: a blob whose key changed is hashed again."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def is_sha256(name: object) -> bool:
    """Whether ``name`` is a sha256 as blobs are named: 64 lowercase hex digits."""
    return isinstance(name, str) and _SHA256_RE.match(name) is not None


def check_host_name(name: str) -> None:
    if not name or name in RESERVED or name.startswith(".") or "/" in name or "\0" in name:
        raise InputError(f"host name {name!r} cannot name a snapshot directory (reserved, hidden or has '/')")


def _info_text(info: dict[str, Any]) -> str:
    return json.dumps(info, indent=1)


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it over ``path``: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
