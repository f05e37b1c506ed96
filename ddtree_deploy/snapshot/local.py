"""The local snapshot store's reading side (:class:`LocalStore`): what every reader of a snapshot needs and what
taking one (:mod:`.take`) reads of the store. The public face is :mod:`ddtree_deploy.snapshot`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable

from .. import facts as facts_mod
from .. import paths
from ..errors import InputError
from .store import Snapshot, Store, blob_key

_READ = 1 << 20


def default_root() -> Path:
    """``$DDTREE_SNAPSHOTS``, else the checkout's ``snapshots/``, else the user data dir (ddtree_deploy.paths)."""
    return paths.snapshot_root()


class LocalStore(Store):
    """The local snapshot store's reading side: blobs checked against their names, snapshots by id, prefix or host,
    verify, materialize and diff. Its files and their format are ``store.Store``'s; taking a snapshot is
    :mod:`.take`'s, through :class:`ddtree_deploy.snapshot.SnapshotStore`."""

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
