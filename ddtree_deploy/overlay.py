"""An overlay: the files a patch set replaces or adds in an installed SGLang package, with their hashes.

It is the hand-off between the patch-set stage (which builds it off-host from a snapshot) and the release stage
(which writes it into a hard-link copy of the installed package on the host). Paths are relative to
site-packages (``sglang/srt/...``), always inside the package, never absolute and never with ``..``; the one
exception is a patch set's plugin distribution (``<name>-<version>.dist-info/<file>``, beside the package: its entry
point is how SGLang's plugin loader finds the hooks), which may never be the package's own dist-info.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .errors import InputError


@dataclass(frozen=True)
class OverlayFile:
    path: str  # relative to site-packages, e.g. "sglang/srt/speculative/ddtree/__init__.py"
    content: bytes
    mode: int = 0o644
    action: str = "replace"  # "replace" an installed file, or "add" a new one

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True)
class Overlay:
    """What to write on top of the installed package, and where it came from."""

    package: str  # "sglang"
    patchset: str  # patch-set name
    patchset_version: str
    base_version: str  # the installed package version it was built for
    base_snapshot: str  # snapshot id it was built from ("" when built from a wheel)
    files: tuple[OverlayFile, ...]
    notes: tuple[str, ...] = field(default=())  # e.g. "--3way used for 0002-tree-verify.patch"

    def __post_init__(self) -> None:
        for f in self.files:
            check_relative_path(f.path, self.package, what="overlay file")

    @property
    def digest(self) -> str:
        """One hash over every path and content: names a release's payload."""
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.path):
            h.update(f.path.encode() + b"\0" + f.sha256.encode() + b"\0" + oct(f.mode).encode() + b"\n")
        return h.hexdigest()

    def manifest(self) -> dict[str, dict[str, object]]:
        return {f.path: {"sha256": f.sha256, "size": len(f.content), "mode": f.mode, "action": f.action} for f in self.files}

    def describe(self) -> dict[str, object]:
        return {
            "package": self.package, "patchset": self.patchset, "patchset_version": self.patchset_version,
            "base_version": self.base_version, "base_snapshot": self.base_snapshot, "digest": self.digest,
            "files": self.manifest(), "notes": list(self.notes),
        }


_DIST_INFO = re.compile(r"^[a-z0-9_]+-[0-9][a-z0-9.]*\.dist-info$")


def is_plugin_dist_info(path: str, package: str) -> bool:
    """``<dist>-<version>.dist-info/<file>`` of a distribution other than ``package``'s own."""
    parts = PurePosixPath(path).parts
    return (len(parts) == 2 and bool(_DIST_INFO.match(parts[0])) and parts[1] in ("METADATA", "entry_points.txt")
            and not parts[0].startswith(package.replace("-", "_") + "-"))


def check_relative_path(path: str, package: str, *, what: str) -> None:
    """Refuse paths that leave the package: absolute, ``..``, or outside ``<package>/`` (but for a plugin
    distribution's METADATA and entry_points.txt, :func:`is_plugin_dist_info`)."""
    if is_plugin_dist_info(path, package):
        return
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or "\\" in path or not p.parts or p.parts[0] != package:
        raise InputError(f"{what} path {path!r} leaves the {package} package (must be relative, under {package}/, no '..')")
