"""Overlay releases on a host: push (one tar stream + one build call), atomic switch, state, lock, cleanup.

The host-side work lives in ``remote/release.py`` (stdlib only, run by the host's Python); this module decides
names, packs the overlay, and turns remote failures into messages that say what happened and what was left as
it was. Nothing here ever writes into the installed site-packages: a release is a hard-link copy of the
installed package in which patched files *replace* their links, and the server sees it only through
``PYTHONPATH=<release_root>/current``.
"""

from __future__ import annotations

import getpass
import io
import socket
import tarfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from .errors import ConnectionCut, DeployError, Fenced, Interrupted, LockHeld, OperationFailed, RemoteError, is_cut
from .hoststate import HostLayout, ReleaseState
from .inventory import Host, probe_setting, server_setting
from .overlay import Overlay
from .lease import Lease, describe_holder, owner_record, tool_gone_here
from .transport import HostConnection

_CHUNK = 1 << 16
_DRIFT_HINT = ("take a fresh snapshot (`ddtree-deploy snapshot HOST`) and apply again, so the patch set is applied to "
               "what is installed now; --allow-base-drift pushes the old files anyway (the host's changes to them are "
               "then not in the release)")


class PushFailed(OperationFailed):
    """The release could not be built on the host; nothing was switched."""


class BaseDrift(PushFailed):
    """The installed package changed since the snapshot the overlay was built from; nothing was switched."""


def new_run_id() -> str:
    """Names one deploy/rollback run in locks, journals and RELEASE.json."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def release_id_for(overlay: Overlay) -> str:
    """``<UTC timestamp>-<overlay digest[:8]>``: sortable, and says which payload it holds."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + overlay.digest[:8]


def overlay_tar_chunks(overlay: Overlay, chunk: int = _CHUNK) -> Iterator[bytes]:
    """The overlay's files as one uncompressed tar stream, produced in chunks (small: the files are source)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        now = int(time.time())
        for f in sorted(overlay.files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.size = len(f.content)
            info.mode = f.mode
            info.mtime = now
            tar.addfile(info, io.BytesIO(f.content))
    data = buf.getvalue()
    for i in range(0, len(data), chunk):
        yield data[i:i + chunk]


class _Counted:
    """An iterable of chunks that counts the bytes taken from it (how much of a push went out)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.sent = chunks, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.sent += len(chunk)
            yield chunk


@dataclass
class PushResult:
    release_id: str
    seconds: float
    link_mode: str
    files: int
    bytes_sent: int
    switched: dict[str, Any] | None = None
    base_drift: list[str] = field(default_factory=list)


class ReleaseManager:
    """Release operations on one host over an open connection."""

    def __init__(self, conn: HostConnection, run_id: str | None = None) -> None:
        self.conn = conn
        self.host: Host = conn.host
        self.root = self.host.release_root
        self.run_id = run_id or new_run_id()
        self.lease: Lease | None = None
        self.stage = "start"  # what the run is doing, for messages about interruptions
        #: Where release_lock says what it did beyond releasing the lock (settled after a dead guardian); the run's
        #: progress lines (transaction.run_on_host), silent otherwise.
        self.notify: Callable[[str], None] | None = None
        self._settling_dead = False

    @property
    def fence(self) -> str | None:
        """Sent with every step that changes the host while we hold the lock: the host refuses it once we do not."""
        return self.run_id if self.lease is not None else None

    def _call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        try:
            return self.conn.call("release", op, timeout=timeout, **args)
        except DeployError as exc:
            hint = f"see `ddtree-deploy releases {self.host.name}` for what the host did"
            if isinstance(exc, RemoteError) and exc.kind == "fenced":
                raise Fenced(f"host {self.host.name}: {exc.message.split(': ', 2)[-1]}", hint=hint) from exc
            lease = self.lease
            if lease is not None and lease.lost and (isinstance(exc, RemoteError) or is_cut(exc)):
                # the lease's watcher dropped this run's connection when its guardian ended (another run broke the
                # lock, kill -9, sshd restarted): the step did not reach the host, whichever came first
                raise Fenced(f"host {self.host.name}: run {self.run_id} no longer holds the deploy lock ({lease.lost}); "
                             f"{op} was not done", hint=hint) from exc
            raise

    # -- lock ------------------------------------------------------------------------------------------------------
    def acquire(self, command: str, *, break_lock: bool = False, guard: dict[str, Any] | None = None,
                wait: float = 0.0) -> dict[str, Any]:
        """Take the host lock (held by a guardian on the host: see Lease) or raise LockHeld naming the owner and
        saying whether that owner is gone. A lock the host is still settling after its run vanished is waited for
        up to ``wait`` seconds."""
        self._lock_args = (command, guard)
        deadline = time.monotonic() + wait
        while True:
            lease = Lease(self.conn, owner_record(self.run_id, command), guard)
            res = lease.open(self.root, break_lock)
            if res.get("acquired"):
                self.lease = lease
                return res
            holder = res.get("holder") or {}
            # the host is settling a vanished run, or is about to (the run's tool ran here and is gone: its guardian
            # gives it up at the end of its input or its next missed heartbeat)
            busy = res.get("settling") or res.get("lock_state") == "busy" or tool_gone_here(holder)
            if busy and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            break
        who, stale = describe_holder(holder, res.get("host_rebooted", False))
        if res.get("settling"):
            why = (holder.get("abandoned") or {}).get("reason")
            raise LockHeld(f"host {self.host.name}: run {holder.get('run_id')} is being rolled back on the host ({why}); "
                           "try again in a moment", hint=f"`ddtree-deploy releases {self.host.name}` shows the journal")
        if stale:
            raise LockHeld(
                f"host {self.host.name}: deploy lock {self.root}/lock is held by {who}, but that run is gone: {stale}",
                hint=f"check nothing is deploying to {self.host.name}, then rerun with --break-lock",
            )
        raise LockHeld(
            f"host {self.host.name}: another deploy is in progress: {who}; refusing to interleave",
            hint="wait for it to finish, or if you are sure it is dead, rerun with --break-lock",
        )

    def release_lock(self) -> dict[str, Any] | None:
        """End of the run: the guardian releases the lock. A guardian that died under us cannot: this run then
        settles the host itself (see settle_dead_lease), and says so. That holds too when the guardian died after
        the run's last step, before the watch saw its channel close: its "release" then goes unanswered, and the
        lock it leaves behind is looked at (see _unanswered_release)."""
        lease, self.lease = self.lease, None
        if lease is None:
            return None
        if lease.lost:
            lease.forget()
            message, outcome = self.settle_dead_lease(lease.lost)
            self._say(f"{lease.lost}; {message}")
            return {"settled": message, "outcome": outcome}
        res = lease.release()
        if res is None:
            return self._unanswered_release(lease)
        return res

    def _say(self, message: str) -> None:
        if self.notify is not None:
            self.notify(message)

    def _unanswered_release(self, lease: Lease) -> dict[str, Any] | None:
        """The guardian did not answer "release": it died before or while it got it (killed after the run's last
        step, taken along by a restart of the host's sshd), or its answer was lost. The lock is removed here only
        when it is provably that guardian's own and dead: still this run's, recorded by the same holder process
        (pid and start time) that the lease's first reply named, and that process gone by the host's own check;
        the host is then settled as the guardian would have done it (settle_dead_lease), and that is said."""
        if self._settling_dead:
            return None  # settle_dead_lease's own release: it says what it did
        try:
            info = self._call("show", root=self.root, timeout=30)
        except DeployError as exc:
            self._say(f"the host's guardian did not answer the lock's release, and the host could not be asked "
                      f"again ({exc.message}); if the guardian died, the next command takes its dead lock over")
            return None
        lock = info.get("lock") or {}
        if lock.get("run_id") != self.run_id:
            return {"released": True}  # the guardian released it; only its answer was lost
        pid, ticks = lease.holder or (None, None)
        own = pid is not None and lock.get("holder_pid") == pid and lock.get("holder_ticks") == ticks
        if not own or info.get("lock_state") != "dead":
            self._say(f"the host's guardian did not answer the lock's release; the lock of this run is still held "
                      f"there ({info.get('lock_state')}, holder pid {lock.get('holder_pid')}): "
                      f"`ddtree-deploy releases {self.host.name}` shows it")
            return None
        why = f"the host's guardian process of this run (pid {pid}) died before it released the lock"
        message, outcome = self.settle_dead_lease(why)
        self._say(f"{why}; {message}")
        return {"settled": message, "outcome": outcome}

    def abandon(self, why: str) -> dict[str, Any] | None:
        """Hand the run to the host's guardian (an interruption): it rolls back what is pending and unlocks."""
        lease, self.lease = self.lease, None
        if lease is not None and lease.lost:
            lease.forget()
            message, outcome = self.settle_dead_lease(f"{why}; {lease.lost}")
            return dict(outcome or {}, action="self", detail=message)
        return lease.abandon(why) if lease is not None else None

    def settle_dead_lease(self, why: str) -> tuple[str, dict[str, Any] | None]:
        """The guardian of this run died (kill -9, the host's sshd restarted and took it along) and left its lock
        behind: take the dead lock over, settle what this run left pending as the guardian would have (back to the
        safe release, server restarted there, `pending` cleared), and release the lock. Says what was done, and returns
        the settlement (None when it could not be done)."""
        command, guard = getattr(self, "_lock_args", ("ddtree-deploy", None))
        self._settling_dead = True
        try:
            try:
                res = self.acquire(command, guard=guard, wait=120.0)  # a step of the run may still be finishing
            except DeployError as exc:
                return f"this run could not take the dead lock over to settle the host: {exc.message}", None
            try:
                found = ReleaseState.of(res["state"])
                if found.pending:
                    outcome = self.reconcile(why, guard,
                                             timeout=60 + float(probe_setting(self.host, "startup_timeout")))
                else:
                    outcome = {"action": "none", "to": found.active}
            except DeployError as exc:
                self.abandon(f"settling a dead guardian's run failed: {exc.message}")
                return (f"this run took the dead lock over but could not settle the host: {exc.message} — the host "
                        "needs attention"), None
            released = self.release_lock()
        finally:
            self._settling_dead = False
        if released is None:  # the lock taken over to settle lost its own guardian's answer: say only what is known
            return (f"this run took the dead lock over and settled the host itself: {describe_settlement(outcome)}; "
                    f"the release of the lock was not answered (`ddtree-deploy releases {self.host.name}` shows "
                    "whether it is still held)"), outcome
        return f"this run settled the host itself and removed the dead lock: {describe_settlement(outcome)}", outcome

    @contextmanager
    def locked(self, command: str, *, break_lock: bool = False, guard: dict[str, Any] | None = None,
               wait: float = 0.0) -> Iterator[dict[str, Any]]:
        """Hold the host lock for the block. Leaving the block normally releases it; an interruption (Ctrl-C,
        SIGTERM) or any unexpected error hands the run to the host, which settles it (see Lease) before the
        exception goes on; a cut connection is left to the host in the same way. When the host's guardian died
        (the lease was lost), this run settles the host itself."""
        info = self.acquire(command, break_lock=break_lock, guard=guard, wait=wait)
        try:
            yield info
        except BaseException as exc:
            if self.lease is not None:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    what = self.abandon(f"interrupted during {self.stage} ({type(exc).__name__})")
                    interrupted = Interrupted(self._settled_message("interrupted", what))
                    interrupted.outcome = what
                    raise interrupted from exc
                if is_cut(exc) or self.lease.lost:
                    message, outcome = self._after_cut(exc)
                    cut = ConnectionCut(self.host.name, message)
                    cut.outcome = outcome
                    raise cut from exc
                if not isinstance(exc, DeployError):
                    self.abandon(f"{type(exc).__name__} during {self.stage}: {exc}")
                else:
                    self.release_lock()
            raise
        else:
            self.release_lock()

    def _settled_message(self, what: str, outcome: dict[str, Any] | None) -> str:
        head = f"host {self.host.name}: {what} during {self.stage}"
        if outcome is None:
            return (f"{head}; the host's guardian was told to settle the run, but its answer did not come back "
                    f"(it rolls back anything unprobed on its own); `ddtree-deploy releases {self.host.name}` shows "
                    "what it did")
        if outcome.get("action") == "self":
            return f"{head}; {outcome['detail']}"
        return f"{head}; {describe_settlement(outcome)}"

    def _after_cut(self, exc: BaseException) -> tuple[str, dict[str, Any] | None]:
        """Reconnect after a cut (or after this run's guardian died), see who settles this run, and say what was done:
        the guardian's settlement when it lived; this run's own when the guardian died and left a dead lock; or, when
        the host cannot be reached, exactly that. Returns the message and the settlement (for the recap)."""
        lease, self.lease = self.lease, None
        lost = lease.lost if lease is not None else None
        if lease is not None:
            lease.forget()
        if lost:
            head = f"{lost} (during {self.stage})"
        elif isinstance(exc, Fenced):
            head = f"the host gave this run up during {self.stage} (it lost the run's connection)"
        else:
            head = f"the SSH connection was cut during {self.stage}"
        budget = 30.0 + float(server_setting(self.host, "stop_timeout")) + float(probe_setting(self.host, "startup_timeout"))
        start = time.monotonic()
        reached = False
        while time.monotonic() - start < budget:
            try:
                info = self._call("show", root=self.root, journal_lines=40, timeout=30)
            except DeployError:
                time.sleep(1.0)
                continue
            reached = True
            lock = info.get("lock") or {}
            st = ReleaseState.of(info["state"])
            ours = st.pending_run == self.run_id
            if lock.get("run_id") == self.run_id or (ours and not lock):
                if info.get("lock_state") in ("dead", "free"):
                    message, outcome = self.settle_dead_lease(lost or f"its guardian is gone ({head})")
                    return f"{head}; {message}", outcome
                time.sleep(0.5)  # our guardian lives: it is settling the run, or notices the lost connection soon
                continue
            if ours:  # another command took the lock over (--break-lock) and is settling this run
                time.sleep(0.5)
                continue
            done = [e for e in info["journal"] if e.get("run") == self.run_id and e.get("event") == "reconciled"]
            if done:
                return f"{head}; {describe_settlement(done[-1])}", done[-1]
            rel = st.active_release or {}
            if rel.get("run") == self.run_id and rel.get("status") == "good":
                return (f"{head}; release {st.active} had passed its probe and its verdict was recorded before "
                        "the cut: it is active and good"), {"action": "none", "to": st.active}
            return (f"{head}; nothing was left pending: the host is on {st.active or 'the installed package'}",
                    {"action": "none", "to": st.active})
        waited = time.monotonic() - start
        if not reached:
            return (f"{head}; the host could not be reached again for {waited:.0f} s, so it is not known whether it "
                    "settled this run: its guardian, if it lives, rolls back anything unprobed when it notices the "
                    "lost connection; if it died, the next command settles what is left; "
                    f"`ddtree-deploy releases {self.host.name}` shows what the host did"), None
        return (f"{head}; the host still holds this run's lock after {waited:.0f} s (its guardian lives and is still "
                f"settling the run); `ddtree-deploy releases {self.host.name}` shows what it did"), None

    # -- push ------------------------------------------------------------------------------------------------------
    def push(self, overlay: Overlay, *, extra_meta: dict[str, Any] | None = None, switch: bool = False,
             stream_filter: Callable[[Iterator[bytes]], Iterator[bytes]] | None = None,
             release_id: str | None = None, base_hashes: dict[str, str] | None = None,
             allow_base_drift: bool = False) -> PushResult:
        """Send the overlay in one tar stream into a staging dir and build ``releases/<id>`` from it, in ONE round
        trip: the streamed form of ``HostConnection.call`` runs the remote ``receive`` op, which unpacks the stream
        that follows its request and then (only if that succeeded) builds. The build never switches: it commits the release only while this run still
        holds the lock and its connection is alive. With ``switch`` a second round trip switches to it, as a
        probing switch when the lock is held (so the host undoes it if the run stops before its verdict).

        ``base_hashes``: sha256 of the installed files the overlay replaces, from the snapshot it was built from;
        the host refuses to build when they changed (unless ``allow_base_drift``). ``stream_filter`` wraps the tar
        chunks on their way out (progress, or a test cutting the link midway).
        """
        start = time.monotonic()
        self.stage = "push"
        rid = release_id or release_id_for(overlay)
        staging = HostLayout(self.root).staging(self.run_id)
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
            "allow_base_drift": allow_base_drift,
            **(extra_meta or {}),
        }
        files = [{"path": f.path, "sha256": f.sha256, "mode": f.mode, "action": f.action} for f in overlay.files]
        chunks: Iterator[bytes] = overlay_tar_chunks(overlay)
        if stream_filter is not None:
            chunks = stream_filter(chunks)
        counted = _Counted(chunks)
        try:
            res = self.conn.call(
                "release", "receive", stream=counted, label=staging, timeout=self.host.command_timeout,
                root=self.root, site_packages=self.host.site_packages, package=overlay.package, release_id=rid,
                staging=staging, files=files, meta=meta, keep=self.host.keep_releases, base_hashes=base_hashes,
                allow_base_drift=allow_base_drift, fence=self.fence)
        except RemoteError as exc:
            raise self._push_failure(exc, rid, staging) from exc
        pushed = PushResult(rid, time.monotonic() - start, res["link_mode"], res["files"], counted.sent,
                            base_drift=list(res.get("base_drift") or []))
        if switch:
            pushed.switched = self.switch(rid, probing=self.lease is not None)
        return pushed

    def _push_failure(self, exc: RemoteError, rid: str, staging: str) -> DeployError:
        """What a failed push says: fenced, base drift, or the build's (or the receiving's) own words; nothing was
        switched in any case."""
        why = exc.message.split(": ", 2)[-1]
        if exc.kind == "fenced":
            return Fenced(f"host {self.host.name}: {why}")
        if exc.kind == "drift":
            return BaseDrift(f"host {self.host.name}: refusing to build release {rid}: {why}\n  nothing was switched",
                             hint=_DRIFT_HINT)
        if exc.kind == "crash":  # the program died before it could clean up after itself
            self._discard(staging)
        return PushFailed(f"host {self.host.name}: building release {rid} failed: {why}")

    def _discard(self, staging: str) -> None:
        try:
            self._call("discard_staging", path=staging)
        except DeployError:
            pass

    # -- switch, state -----------------------------------------------------------------------------------------------
    def switch(self, release_id: str | None, *, reason: str = "deploy", mark_bad: str | None = None,
               note: str = "", probing: bool = False) -> dict[str, Any]:
        """Point ``current`` at ``release_id`` (None: the installed package) in one atomic rename; optionally mark
        the release being left bad in the same round trip. ``probing``: the release has not passed its probe: the
        host records the release to go back to before it switches (see remote/release.py)."""
        self.stage = "switch"
        try:
            return self._call("switch", root=self.root, release_id=release_id, run_id=self.run_id, reason=reason,
                              mark_bad=mark_bad, note=note, fence=self.fence, probing=probing)
        except RemoteError as exc:
            if exc.kind == "drift":  # the last look before `current` moved found the installed files changed
                raise BaseDrift(f"host {self.host.name}: refusing to switch to release {release_id}: "
                                f"{exc.message.split(': ', 2)[-1]}\n  nothing was switched", hint=_DRIFT_HINT) from exc
            raise

    def roll_back(self, target: str | None, *, failed: str | None, note: str, spec: dict[str, Any] | None,
                  timeout: float | None = None) -> dict[str, Any]:
        """Back to ``target``, marking ``failed`` bad, restarting the server there when ``spec`` is given: one round
        trip, the same steps the host's guardian takes after an interruption."""
        self.stage = "rollback"
        return self._call("roll_back", timeout=timeout, root=self.root, target=target, failed=failed, run_id=self.run_id,
                          note=note, spec=spec, fence=self.fence)

    def reconcile(self, why: str, guard: dict[str, Any] | None, timeout: float | None = None) -> dict[str, Any]:
        """Settle a pending switch that a vanished run left behind (the host could not: a reboot, a killed guardian)."""
        self.stage = "reconcile"
        return self._call("reconcile", timeout=timeout, root=self.root, run_id=self.run_id, why=why, guard=guard,
                          fence=self.fence)

    def finish(self, release_id: str | None, status: str | None, event: str, note: str = "", **fields: Any) -> list[str]:
        """Verdict on ``release_id``, the pending switch cleared, cleanup (keep_releases) and a journal line: one
        round trip at the end of a run (the lock is released when the ``locked()`` block ends)."""
        fields = {"by": f"{getpass.getuser()}@{socket.gethostname()}", **fields}
        res = self._call("finish", root=self.root, release_id=release_id, status=status, keep=self.host.keep_releases,
                         run_id=self.run_id, event=event, fields=fields, note=note, fence=self.fence)
        return res["removed"]

    def mark(self, release_id: str, status: str, note: str = "") -> dict[str, Any]:
        return self._call("mark", root=self.root, release_id=release_id, status=status, run_id=self.run_id, note=note,
                          fence=self.fence)

    def discard_release(self, release_id: str, why: str) -> bool:
        """Remove ``release_id``, which this run pushed and never switched to (remote/release.py discard_release)."""
        return bool(self._call("discard_release", root=self.root, release_id=release_id, run_id=self.run_id, why=why,
                               fence=self.fence)["removed"])

    def show(self, journal_lines: int = 0) -> dict[str, Any]:
        return self._call("show", root=self.root, journal_lines=journal_lines)

    def state(self) -> ReleaseState:
        """The host's release state now (``show``'s ``state``, typed)."""
        return ReleaseState.of(self.show()["state"])

    def cleanup(self) -> list[str]:
        return self._call("cleanup", root=self.root, keep=self.host.keep_releases, run_id=self.run_id,
                          fence=self.fence)["removed"]

    def installed_manifest(self, package: str = "sglang") -> dict[str, Any]:
        return self.conn.call("manifest", "package_manifest", site_packages=self.host.site_packages, package=package)


def describe_settlement(outcome: dict[str, Any]) -> str:
    """What the host did to settle a run that stopped early (the guardian's or a later command's reconcile)."""
    action = outcome.get("action") or outcome.get("outcome")
    to = outcome.get("to")
    where = f"release {to}" if to else "the installed package (no overlay)"
    health = outcome.get("health")
    state = health.get("state") if isinstance(health, dict) else health
    restarted = outcome.get("restarted")
    server = ""
    if restarted or state:
        server = f"; server restarted there: {'/health 200' if state == 'ready' else 'START-UP ' + str(state).upper()}"
    if action == "rolled-back":
        left = outcome.get("release")
        what = f"release {left}" if left else "the installed package"
        return f"the host rolled back: {what} was switched in but had no verdict from its probe; back on {where}{server}"
    if action == "server-restored":
        return f"the host restarted the server on {where} as configured{server}"
    if action == "failed":
        return f"the host could not settle the run: {outcome.get('detail')} — the host needs attention"
    return f"nothing was pending on the host (it is on {where}); it released the lock"

