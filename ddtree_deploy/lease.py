"""The host lock of a run, from the control side: a guardian session on the host (remote ``release.hold``) fed a
heartbeat, the record naming who holds it, and handing every open run to its host on Ctrl-C.

The host side is ``remote/_lease.py``; the transaction it keeps is in docs/design.md ("The deploy transaction").
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
from typing import Any

from .errors import DeployError, OperationFailed
from .transport import HostConnection, RemoteSession

#: How long the host waits for a heartbeat before it gives a run up and rolls it back on its own.
LEASE_TIMEOUT = float(os.environ.get("DDTREE_LEASE_TIMEOUT", "30"))
HEARTBEAT = 2.0
#: How often the control side looks whether the guardian's channel is still open.
WATCH = 0.5


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
    if holder.get("holder_pid"):
        return who, None  # the host checked its holder process: it lives, so the run may still act
    same_machine = holder.get("control_host") == socket.gethostname() and holder.get("control_boot_id") == _boot_id()
    pid = holder.get("control_pid")
    if same_machine and isinstance(pid, int) and not _pid_alive(pid):
        return who, f"pid {pid} no longer runs on {holder.get('control_host')}"
    if holder.get("control_host") == socket.gethostname() and holder.get("control_boot_id") != _boot_id():
        return who, f"{holder.get('control_host')} has rebooted since the lock was taken"
    return who, None


def tool_gone_here(holder: dict[str, Any]) -> bool:
    """The lock's run was started on this machine (this boot) and its process no longer runs."""
    pid = holder.get("control_pid")
    return (bool(holder.get("holder_pid")) and holder.get("control_host") == socket.gethostname()
            and holder.get("control_boot_id") == _boot_id() and isinstance(pid, int) and not _pid_alive(pid))


class Lease:
    """The host lock of one run, held by a guardian process on the host (remote ``release.hold``) on a channel of
    the run's own SSH connection, with a heartbeat from here every few seconds.

    When the control side goes away while it is held (Ctrl-C, kill -9, a cut connection, a suspended laptop), the
    guardian sees it (end of input, its sshd gone, or no heartbeat for LEASE_TIMEOUT s) and settles the run on the
    host itself: a release switched in but not yet probed is switched out again, the server restarted on the last
    good release, and only then is the lock released. So the lock never outlives its run silently, and nothing
    unprobed stays active behind it.
    """

    def __init__(self, conn: HostConnection, owner: dict[str, Any], guard: dict[str, Any] | None) -> None:
        self.conn, self.owner, self.guard = conn, owner, guard
        self.session: RemoteSession | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why the guardian is gone while we held the lease (see _beat)
        self.holder: tuple[Any, Any] | None = None  # the guardian's (pid, start ticks) on the host, from its first reply

    def open(self, root: str, break_lock: bool) -> dict[str, Any]:
        if not getattr(self.conn, "holds_session", False):
            host = self.conn.host
            raise OperationFailed(
                f"host {host.name}: the host lock needs a guardian session on the host, and the "
                f"'{host.connection}' transport ({type(self.conn).__name__}) cannot hold one, so the lock is not "
                "taken and nothing is changed", hint="use a transport that holds sessions (ssh or local) for hosts "
                "that are deployed to")
        self.session = self.conn.session("release", "hold", root=root, owner=self.owner, break_lock=break_lock,
                                         guard=self.guard, lease_timeout=LEASE_TIMEOUT)
        got = self.session.reply(timeout=max(60.0, self.conn.host.connect_timeout * 6))
        if not got.get("acquired"):
            self.session.close()
            self.session = None
            return got
        self.holder = (got.get("holder_pid"), got.get("holder_ticks"))
        self._thread = threading.Thread(target=self._beat, daemon=True, name="ddtree-lease")
        self._thread.start()
        _OPEN_LEASES.add(self)
        return got

    def _beat(self) -> None:
        """A heartbeat every HEARTBEAT s, and a look at the guardian's channel every WATCH s: when the guardian ended
        while we hold the lease (kill -9 of it, the host's sshd restarted, the connection cut), the lease is lost:
        say why and drop the run's connection, so the step in flight stops at once instead of at its timeout."""
        ticks = 0
        while not self._stop.wait(WATCH):
            session = self.session
            if session is None:
                return
            ticks += 1
            beat = ticks * WATCH >= HEARTBEAT
            if beat:
                ticks = 0
            gone = _session_ended(session) or (beat and not session.send("hb"))
            if gone and not self._stop.is_set():
                self.lost = ("the host's guardian process of this run ended (its channel closed): the lock it held "
                             "is dead")
                self.conn.close()
                return

    def _end(self, line: str, timeout: float) -> dict[str, Any] | None:
        self._stop.set()
        _OPEN_LEASES.discard(self)
        session, self.session = self.session, None
        if session is None:
            return None
        try:
            if not session.send(line):
                return None
            return session.reply(timeout=timeout)
        except (DeployError, KeyboardInterrupt):  # a second Ctrl-C: the host goes on settling without us
            return None
        finally:
            session.close()

    def forget(self) -> None:
        """Stop the heartbeat and drop the session without a word to the guardian (it is gone)."""
        self._stop.set()
        _OPEN_LEASES.discard(self)
        session, self.session = self.session, None
        if session is not None:
            session.close()

    def release(self) -> dict[str, Any] | None:
        """End of the run: the guardian releases the lock (or, if a switch is still pending, settles it first).
        None when its answer did not come (it died before or while it got the line: ReleaseManager.release_lock
        then looks at the lock itself)."""
        return self._end("release", timeout=self.settle_budget())

    def abandon(self, why: str) -> dict[str, Any] | None:
        """Give the run up: the guardian settles it on the host; returns what it did (None if we lost it)."""
        return self._end("abandon " + why.replace("\n", " ")[:300], timeout=self.settle_budget())

    def settle_budget(self) -> float:
        g = self.guard or {}
        return 60.0 + float(g.get("stop_timeout", 20.0)) + float(g.get("startup_timeout", 0.0))


def _session_ended(session: RemoteSession) -> bool:
    try:
        return bool(session.chan.closed or session.chan.exit_status_ready())
    except (OSError, EOFError):
        return True


_OPEN_LEASES: set[Lease] = set()


def abandon_all(why: str) -> int:
    """Hand every run this process holds to its host (Ctrl-C during a fleet apply: each host settles its own run).
    Returns how many runs were handed over."""
    leases = list(_OPEN_LEASES)
    threads = [threading.Thread(target=lease.abandon, args=(why,), daemon=True) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return len(leases)
