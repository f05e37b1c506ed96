"""Where the base files come from when a patch set is applied: a snapshot of a host, or a released wheel.

Both look the same to the apply engine and the developer workflow — list the package's files, read one, know the
package version — so the machinery runs and is tested on real SGLang wheels without any host, and on snapshots
taken from hosts in production. Paths are relative to site-packages (``sglang/srt/server_args.py``).
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import InputError


class BaseSource(ABC):
    """The files of one installed (or installable) release of ``package``."""

    package: str
    version: str
    label: str  # for messages: "wheel sglang-0.5.23-...whl" or "snapshot <id>"
    snapshot_id: str = ""  # "" unless built from a snapshot

    @abstractmethod
    def list_files(self) -> list[str]:
        """Every regular file of the package (paths start with ``<package>/``), sorted."""

    @abstractmethod
    def read(self, path: str) -> bytes:
        """The bytes of one file; ``FileNotFoundError`` if the base has no such file."""

    @abstractmethod
    def mode(self, path: str) -> int:
        """Permission bits of one file (0o644 or 0o755 in practice)."""

    def has(self, path: str) -> bool:
        return path in self._index()

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.read(path)).hexdigest()

    def read_many(self, paths: Iterable[str]) -> dict[str, bytes]:
        return {p: self.read(p) for p in paths}

    def materialize(self, dest: Path, paths: Iterable[str] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Write ``paths`` (default: every file) under ``dest`` laid out like site-packages; return what was written."""
        todo = list(paths) if paths is not None else self.list_files()
        for n, path in enumerate(todo, 1):
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read(path))
            target.chmod(self.mode(path))
            if progress and (n % 200 == 0 or n == len(todo)):
                progress(n, len(todo))
        return todo

    def _index(self) -> frozenset[str]:
        cached = getattr(self, "_index_cache", None)
        if cached is None:
            cached = frozenset(self.list_files())
            self._index_cache = cached
        return cached

    def describe(self) -> dict[str, str]:
        return {"package": self.package, "version": self.version, "source": self.label, "snapshot": self.snapshot_id}


class WheelBase(BaseSource):
    """A wheel file read in place (only the members asked for are decompressed: the 0.5.23 wheel has ~6k files)."""

    def __init__(self, wheel: Path, package: str = "sglang") -> None:
        self.wheel = Path(wheel)
        self.package = package
        try:
            self._zip = zipfile.ZipFile(self.wheel)
        except (OSError, zipfile.BadZipFile) as exc:
            raise InputError(f"{self.wheel}: not a readable wheel: {exc}") from None
        self._members: dict[str, zipfile.ZipInfo] = {}
        prefix = f"{package}/"
        for info in self._zip.infolist():
            name = info.filename
            if info.is_dir() or not name.startswith(prefix) or ".." in name.split("/"):
                continue
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                continue  # a symlink inside a wheel is never a package file we patch
            self._members[name] = info
        if not self._members:
            raise InputError(f"{self.wheel}: has no files under {prefix}")
        self.version = self._version()
        self.label = f"wheel {self.wheel.name}"

    def _version(self) -> str:
        for name in self._zip.namelist():
            if name.endswith(".dist-info/METADATA"):
                for line in self._zip.read(name).decode("utf-8", "replace").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        m = re.match(r"^[^-]+-([^-]+)-", self.wheel.name)
        if not m:
            raise InputError(f"{self.wheel}: cannot tell the package version (no METADATA, odd file name)")
        return m.group(1)

    def list_files(self) -> list[str]:
        return sorted(self._members)

    def has(self, path: str) -> bool:
        return path in self._members

    def read(self, path: str) -> bytes:
        info = self._members.get(path)
        if info is None:
            raise FileNotFoundError(f"{self.label} has no {path}")
        return self._zip.read(info)

    def mode(self, path: str) -> int:
        info = self._members.get(path)
        if info is None:
            raise FileNotFoundError(f"{self.label} has no {path}")
        bits = (info.external_attr >> 16) & 0o777
        return bits or 0o644

    def close(self) -> None:
        self._zip.close()


class SnapshotBase(BaseSource):
    """A snapshot in the local store (``ddtree_deploy.snapshot``): its manifest lists the files, its blobs hold them.

    Every blob read is checked against the manifest's sha256, so a corrupted store cannot feed the apply step.
    """

    def __init__(self, snapshot: Any, package: str | None = None, store: Any | None = None) -> None:
        if isinstance(snapshot, str):
            store = store if store is not None else _default_store()
            snapshot = store.get(snapshot)
        elif store is None:  # a Snapshot object: it knows the store that holds it
            store = _default_store(Path(snapshot.store_root))
        self.store = store
        self.snapshot = snapshot
        self.package = package or getattr(snapshot, "package", None) or "sglang"
        self.snapshot_id = str(snapshot.id)
        if not snapshot.package_version:
            raise InputError(f"snapshot {self.snapshot_id}: does not record the {self.package} version")
        self.version = str(snapshot.package_version)
        self.label = f"snapshot {self.snapshot_id}"
        self._manifest = {p: m for p, m in dict(snapshot.manifest).items() if p.startswith(f"{self.package}/")}
        if not self._manifest:
            raise InputError(f"snapshot {self.snapshot_id}: its manifest has no files under {self.package}/")

    def list_files(self) -> list[str]:
        return sorted(self._manifest)

    def has(self, path: str) -> bool:
        return path in self._manifest

    def _entry(self, path: str) -> dict[str, Any]:
        entry = self._manifest.get(path)
        if entry is None:
            raise FileNotFoundError(f"{self.label} has no {path}")
        return entry

    def mode(self, path: str) -> int:
        return int(self._entry(path).get("mode", 0o644)) & 0o777 or 0o644

    def sha256(self, path: str) -> str:
        self.read(path)  # verified against the manifest on the way
        return str(self._entry(path)["sha256"])

    def read(self, path: str) -> bytes:
        return self.store.read_blob(self._entry(path)["sha256"], path=path, snapshot_id=self.snapshot_id)

    def materialize(self, dest: Path, paths: Iterable[str] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> list[str]:
        todo = list(paths) if paths is not None else self.list_files()
        self.store.materialize(self.snapshot, dest, todo)
        if progress:
            progress(len(todo), len(todo))
        return todo


def _default_store(root: Path | None = None) -> Any:
    try:
        from ..snapshot import SnapshotStore  # imported late: wheel users need no snapshot store
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.endswith("snapshot"):
            raise InputError("--snapshot: this build has no snapshot store; use --base sglang==X") from None
        raise
    return SnapshotStore(root) if root is not None else SnapshotStore()


def as_base_source(obj: Any) -> BaseSource:
    """A BaseSource from what a caller holds: a BaseSource, a Snapshot object, or a snapshot id."""
    if isinstance(obj, BaseSource):
        return obj
    if isinstance(obj, str):
        return SnapshotBase(obj)
    if hasattr(obj, "manifest") and hasattr(obj, "package_version"):
        return SnapshotBase(obj)
    raise TypeError(f"not a base source: {obj!r} (expected a BaseSource, a Snapshot or a snapshot id)")


_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def open_base(*, snapshot: str | None = None, base: str | None = None) -> BaseSource:
    """The base named on the command line: ``--snapshot ID``, or ``--base sglang==X`` / ``--base path/to.whl``."""
    if bool(snapshot) == bool(base):
        raise InputError("give exactly one of --snapshot ID or --base sglang==VERSION")
    if snapshot:
        return SnapshotBase(snapshot)
    assert base is not None
    if base.endswith(".whl"):
        path = Path(base)
        if not path.is_file():
            raise InputError(f"--base: wheel file {base} does not exist")
        package = path.name.split("-", 1)[0].replace("_", "-")
        return WheelBase(path, package=package)
    m = _SPEC.match(base.strip())
    if not m:
        raise InputError(f"--base: expected PACKAGE==VERSION (e.g. sglang==0.5.23) or a .whl file, got {base!r}")
    from ..wheels import fetch_wheel

    package, version = m.group(1), m.group(2)
    return WheelBase(fetch_wheel(package, version), package=package)
