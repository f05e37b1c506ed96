"""What a snapshot's manifest is and may be: its digest, and the refusal of a manifest that leaves the package or
names content by anything but a sha256."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ..errors import OperationFailed
from .store import is_sha256


def manifest_digest(files: dict[str, dict[str, Any]], links: dict[str, str] | None = None) -> str:
    """One sha256 over every path, content hash and mode: equal digests mean byte-identical packages."""
    h = hashlib.sha256()
    for path in sorted(files):
        e = files[path]
        h.update(f"{path}\0{e['sha256']}\0{e['mode']:o}\n".encode())
    for path in sorted(links or {}):
        h.update(f"{path}\0->{links[path]}\n".encode())
    return h.hexdigest()


def check_manifest(host_name: str, package: str, raw: dict[str, Any]) -> None:
    """Refuse a manifest from a host whose paths leave the package: absolute, with ``..``, a backslash or NUL, or
    outside ``<package>/`` and its dist-info; links whose targets leave them; and a content hash that is not a
    sha256 (the store names its blobs by it: ``../x`` or an absolute path would name a file outside the store, which
    the check of the blobs already held would remove). Checked on arrival, before anything is stored (a hostile or
    broken host must not name files the store or a work tree would write)."""
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
    for path, entry in (raw.get("files") or {}).items():
        sha = entry[0] if isinstance(entry, (list, tuple)) and entry else entry
        if not is_sha256(sha):
            raise OperationFailed(f"host {host_name}: its manifest gives {path!r} the content hash {str(sha)[:80]!r}, "
                                  "which is not a sha256 (64 hex digits); refusing the snapshot (nothing was stored)")
    for path, target in (raw.get("links") or {}).items():
        joined = os.path.normpath(os.path.join(os.path.dirname(path), str(target)))
        if str(target).startswith("/") or bad(joined):
            raise OperationFailed(f"host {host_name}: its manifest has a link {path!r} -> {target!r} that leaves the "
                                  "package; refusing the snapshot (nothing was stored)")
