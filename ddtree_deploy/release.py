"""Overlay releases on a host: push (one tar stream + one build call), atomic switch, state, lock, cleanup.

The host-side work lives in ``remote/release.py`` (stdlib only, run by the host's Python); this module decides
names, packs the overlay, and turns remote failures into messages that say what happened and what was left as
it was. Nothing here ever writes into the installed site-packages: a release is a hard-link copy of the
installed package in which patched files *replace* their links, and the server sees it only through
``PYTHONPATH=<release_root>/current``.
"""

from __future__ import annotations

import base64
import getpass
import io
import json
import os
import posixpath
import shlex
import socket
import tarfile
import time
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from .errors import DeployError, OperationFailed
from .inventory import Host
from .overlay import Overlay
from .remote import RESULT_MARKER, program_for
from .transport import HostConnection

_CHUNK = 1 << 16
#: The build request travels inside the overlay's tar stream (argv is too small for large overlays' metadata).
REQUEST_NAME = ".ddtree-build-request.json"


class LockHeld(OperationFailed):
    """Another run holds the host's deploy lock (or a dead run left it behind)."""


class PushFailed(OperationFailed):
    """The release could not be built on the host; nothing was switched."""


def new_run_id() -> str:
    """Names one deploy/rollback run in locks, journals and RELEASE.json."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def release_id_for(overlay: Overlay) -> str:
    """``<UTC timestamp>-<overlay digest[:8]>``: sortable, and says which payload it holds."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + overlay.digest[:8]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_record(run_id: str, command: str) -> dict[str, Any]:
    """Who holds a lock: enough for a person to find the run, and for us to tell a dead one."""
    return {
        "run_id": run_id,
        "user": getpass.getuser(),
        "control_host": socket.gethostname(),
        "control_pid": os.getpid(),
        "control_boot_id": _boot_id(),
        "command": command,
    }


def describe_holder(holder: dict[str, Any], host_rebooted: bool) -> tuple[str, str | None]:
    """A sentence naming the lock's owner, and why it is stale (None when the owner may still be running)."""
    who = (f"run {holder.get('run_id')} by {holder.get('user')}@{holder.get('control_host')} "
           f"(pid {holder.get('control_pid')}, since {holder.get('taken')}, `{holder.get('command')}`)")
    if holder.get("unreadable"):
        return "an unreadable lock file", "the lock file cannot be parsed"
    if host_rebooted:
        return who, "the host has rebooted since the lock was taken"
    same_machine = holder.get("control_host") == socket.gethostname() and holder.get("control_boot_id") == _boot_id()
    pid = holder.get("control_pid")
    if same_machine and isinstance(pid, int) and not _pid_alive(pid):
        return who, f"pid {pid} no longer runs on {holder.get('control_host')}"
    if holder.get("control_host") == socket.gethostname() and holder.get("control_boot_id") != _boot_id():
        return who, f"{holder.get('control_host')} has rebooted since the lock was taken"
    return who, None


def overlay_tar_chunks(overlay: Overlay, chunk: int = _CHUNK, extra: dict[str, bytes] | None = None) -> Iterator[bytes]:
    """The overlay's files (and ``extra`` files at the top, e.g. the build request) as one uncompressed tar stream,
    produced in chunks (small: the files are source). The extra files come last, so a cut stream never holds a
    request without all the files it names."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        now = int(time.time())
        for f in sorted(overlay.files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.size = len(f.content)
            info.mode = f.mode
            info.mtime = now
            tar.addfile(info, io.BytesIO(f.content))
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            info.mtime = now
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    for i in range(0, len(data), chunk):
        yield data[i:i + chunk]


@dataclass
class PushResult:
    release_id: str
    seconds: float
    link_mode: str
    files: int
    bytes_sent: int
    switched: dict[str, Any] | None = None


class ReleaseManager:
    """Release operations on one host over an open connection."""

    def __init__(self, conn: HostConnection, run_id: str | None = None) -> None:
        self.conn = conn
        self.host: Host = conn.host
        self.root = self.host.release_root
        self.run_id = run_id or new_run_id()
        self._holding = False  # inside locked(): finish() may release the lock in its round trip

    def _call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        return self.conn.call("release", op, timeout=timeout, **args)

    # -- lock ------------------------------------------------------------------------------------------------------
    def acquire(self, command: str, *, break_lock: bool = False) -> dict[str, Any]:
        """Take the host lock or raise LockHeld naming the owner (and saying whether that owner is gone)."""
        res = self._call("lock", root=self.root, owner=owner_record(self.run_id, command), break_lock=break_lock)
        if res["acquired"]:
            return res
        who, stale = describe_holder(res["holder"], res.get("host_rebooted", False))
        if stale:
            raise LockHeld(
                f"host {self.host.name}: deploy lock {self.root}/lock is held by {who}, but that run is gone: {stale}",
                hint=f"check nothing is deploying to {self.host.name}, then rerun with --break-lock",
            )
        raise LockHeld(
            f"host {self.host.name}: another deploy is in progress: {who}; refusing to interleave",
            hint="wait for it to finish, or if you are sure it is dead, rerun with --break-lock",
        )

    def release_lock(self) -> None:
        self._call("unlock", root=self.root, run_id=self.run_id)

    @contextmanager
    def locked(self, command: str, *, break_lock: bool = False) -> Iterator[dict[str, Any]]:
        """Hold the host lock for the block; released at the end (by ``finish`` when the block calls it)."""
        info = self.acquire(command, break_lock=break_lock)
        self._holding = True
        try:
            yield info
        finally:
            if self._holding:
                try:
                    self.release_lock()
                except DeployError:
                    pass  # connection lost: the lock stays and will be reported as stale, never silently broken
            self._holding = False

    # -- push ------------------------------------------------------------------------------------------------------
    def push(self, overlay: Overlay, *, extra_meta: dict[str, Any] | None = None, switch: bool = False,
             stream_filter: Callable[[Iterator[bytes]], Iterator[bytes]] | None = None,
             release_id: str | None = None) -> PushResult:
        """Send the overlay in one tar stream into a staging dir and build ``releases/<id>`` from it, in ONE SSH
        round trip: ``tar -x`` on the host, then (only if it succeeded) the remote ``build`` op, whose request
        travels inside the same tar. With ``switch`` the build also switches ``current`` to the new release, still
        in that one remote call; otherwise nothing is switched.

        ``stream_filter`` wraps the tar chunks on their way out (progress, or a test cutting the link midway).
        """
        start = time.monotonic()
        rid = release_id or release_id_for(overlay)
        staging = posixpath.join(self.root, "staging", self.run_id)
        meta = {
            "run_id": self.run_id,
            "patchset": overlay.patchset,
            "patchset_version": overlay.patchset_version,
            "base_version": overlay.base_version,
            "base_snapshot": overlay.base_snapshot,
            "overlay_digest": overlay.digest,
            "overlay": overlay.manifest(),
            "notes": list(overlay.notes),
            "pushed_by": f"{getpass.getuser()}@{socket.gethostname()}",
            **(extra_meta or {}),
        }
        files = [{"path": f.path, "sha256": f.sha256, "mode": f.mode, "action": f.action} for f in overlay.files]
        request = json.dumps({"op": "build", "args": {
            "root": self.root, "site_packages": self.host.site_packages, "package": overlay.package, "release_id": rid,
            "staging": staging, "files": files, "meta": meta, "keep": self.host.keep_releases, "and_switch": switch,
        }}).encode()
        sent = [0]

        def counted(source: Iterable[bytes]) -> Iterator[bytes]:
            for c in source:
                sent[0] += len(c)
                yield c

        chunks: Iterator[bytes] = overlay_tar_chunks(overlay, extra={REQUEST_NAME: request})
        if stream_filter is not None:
            chunks = stream_filter(chunks)
        q = shlex.quote(staging)
        boot = (
            "import sys,zlib,base64;"
            f"p=zlib.decompress(base64.b64decode('{base64.b64encode(zlib.compress(program_for('release'), 9)).decode()}'));"
            f"exec(compile(p,'<ddtree-remote>','exec'),{{'__name__':'__ddtree_remote__','_PAYLOAD':open(sys.argv[1],'rb').read()}})"
        )
        cmd = (f"rm -rf {q} && mkdir -p {q} && tar -x -f - -C {q} --no-same-owner && "
               f"exec {shlex.quote(self.host.python)} -c {shlex.quote(boot)} {shlex.quote(posixpath.join(staging, REQUEST_NAME))}")
        # transport.send_stream is run(stdin=chunks) with check=True; we need the output of a failed build too
        result = self.conn.run(cmd, stdin=counted(chunks), timeout=self.host.command_timeout, check=False)
        text = result.text()
        if RESULT_MARKER not in text:
            self._discard(staging)
            err = (result.stderr.decode(errors="replace") or text).strip()[-1500:]
            if "No space left" in err:
                raise PushFailed(f"host {self.host.name}: no space left on the release root {self.root} while "
                                 "receiving the overlay; nothing was switched")
            raise PushFailed(f"host {self.host.name}: receiving the overlay into {staging} failed "
                             f"(exit {result.exit_code}: {err}); nothing was switched")
        reply = json.loads(text.rsplit(RESULT_MARKER, 1)[1].strip().splitlines()[0])
        if not reply.get("ok"):
            raise PushFailed(f"host {self.host.name}: building release {rid} failed: {reply.get('error')}")
        res = reply["result"]
        return PushResult(rid, time.monotonic() - start, res["link_mode"], res["files"], sent[0], res.get("switch"))

    def _discard(self, staging: str) -> None:
        try:
            self._call("discard_staging", path=staging)
        except DeployError:
            pass

    # -- switch, state -----------------------------------------------------------------------------------------------
    def switch(self, release_id: str | None, *, reason: str = "deploy", mark_bad: str | None = None,
               note: str = "") -> dict[str, Any]:
        """Point ``current`` at ``release_id`` (None: the installed package) in one atomic rename; optionally mark
        the release being left bad in the same round trip."""
        return self._call("switch", root=self.root, release_id=release_id, run_id=self.run_id, reason=reason,
                          mark_bad=mark_bad, note=note)

    def finish(self, release_id: str | None, status: str | None, event: str, note: str = "", **fields: Any) -> list[str]:
        """Verdict on ``release_id``, cleanup (keep_releases), a journal line and, inside ``locked()``, the unlock:
        one round trip at the end of a run."""
        fields = {"by": f"{getpass.getuser()}@{socket.gethostname()}", **fields}
        res = self._call("finish", root=self.root, release_id=release_id, status=status, keep=self.host.keep_releases,
                         run_id=self.run_id, event=event, fields=fields, note=note, release_lock=self._holding)
        if self._holding and res.get("unlocked", {}).get("released"):
            self._holding = False
        return res["removed"]

    def mark(self, release_id: str, status: str, note: str = "") -> dict[str, Any]:
        return self._call("mark", root=self.root, release_id=release_id, status=status, run_id=self.run_id, note=note)

    def journal(self, event: str, **fields: Any) -> None:
        self._call("journal", root=self.root, event=event, fields={"run": self.run_id, **fields})

    def show(self, journal_lines: int = 0) -> dict[str, Any]:
        return self._call("show", root=self.root, journal_lines=journal_lines)

    def read_release(self, release_id: str) -> dict[str, Any]:
        return self._call("read_release", root=self.root, release_id=release_id)

    def cleanup(self) -> list[str]:
        return self._call("cleanup", root=self.root, keep=self.host.keep_releases, run_id=self.run_id)["removed"]

    def installed_manifest(self, package: str = "sglang") -> dict[str, Any]:
        return self._call("package_manifest", site_packages=self.host.site_packages, package=package)

    def release_path(self, release_id: str | None) -> str:
        return posixpath.join(self.root, "releases", release_id) if release_id else posixpath.join(self.root, "base")


def rollback_target(state: dict[str, Any], failed: str | None) -> str | None:
    """Where to go back to: the recorded previous good release unless it is bad, gone or the failed one; else the
    newest good release; else None (the installed package, always safe). Never derived from directory order."""
    releases = {r["id"]: r for r in state.get("releases", [])}
    bad = set(state.get("bad", [])) | ({failed} if failed else set())
    prev = state.get("previous_good")
    if prev is None:
        return None  # what ran before the failed switch was the installed package
    if prev not in bad and prev in releases and releases[prev].get("exists", True):
        return prev
    for rel in reversed(state.get("releases", [])):
        if rel["id"] not in bad and rel.get("status") == "good" and rel.get("exists", True):
            return rel["id"]
    return None

