"""The release root's state.json, journal, the `current` link and the step lock (.oplock): the part of the release
ops (release.py) every other part stands on. Stdlib only."""
import errno
import fcntl
import json
import os
import socket

from . import server as _server
from ._frame import Failure, _now, _write_json

STATE_VERSION = 1
#: Space held back (<root>/.reserve) for the writes a rollback needs once the disk filled after a switch.
RESERVE_BYTES = 1 << 20


# -- state, journal ----------------------------------------------------------------------------------------------------
def _load_state(root):
    path = os.path.join(root, "state.json")
    try:
        with open(path) as fh:
            state = json.load(fh)
    except FileNotFoundError:
        state = {}
    except ValueError as exc:
        raise Failure("%s is not valid JSON (%s); fix or remove it by hand" % (path, exc), "state") from None
    state.setdefault("version", STATE_VERSION)
    state.setdefault("releases", [])
    state.setdefault("active", None)
    state.setdefault("previous_good", None)
    state.setdefault("bad", [])
    state.setdefault("pending", None)
    link = _current_target(root)
    if link is not None:  # `current` is the truth; state.json follows it (a crash may sit between the two writes)
        state["active"] = None if link == "base" else os.path.basename(link)
    return state


def _save_state(root, state):
    _with_reserve(root, _write_json, os.path.join(root, "state.json"), state, indent=1)


def _journal(root, event, **fields):
    entry = {"time": _now(), "event": event, "host": socket.gethostname()}
    entry.update(fields)
    _with_reserve(root, _append_line, os.path.join(root, "journal.log"), json.dumps(entry, sort_keys=True) + "\n")


def _append_line(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- the reserve: a rollback needs no new disk space ----------------------------------------------------------------------
def _reserve_path(root):
    return os.path.join(root, ".reserve")


def _ensure_reserve(root):
    """Hold RESERVE_BYTES of the release root's disk in <root>/.reserve (a probing switch does this before `current`
    moves): what the state and journal writes of the switch's verdict or rollback need, should the disk fill up
    after the switch. Raises the disk failure (nothing switched) when the space is not there."""
    path = _reserve_path(root)
    try:
        if os.path.getsize(path) >= RESERVE_BYTES:
            return
    except OSError:
        pass
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                block = b"\0" * (1 << 16)
                for _ in range(RESERVE_BYTES // len(block)):
                    os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise _disk_failure(root, exc, "reserving %d KB for a rollback's writes" % (RESERVE_BYTES >> 10)) from None


def _spend_reserve(root):
    """Free the reserve (right before a write that found the disk full); False when there was none left."""
    try:
        os.unlink(_reserve_path(root))
        return True
    except OSError:
        return False


def _with_reserve(root, write, *args, **kwargs):
    """``write(*args)``; on a full disk, free the reserve and write once more (the write needs no new space then)."""
    try:
        return write(*args, **kwargs)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _spend_reserve(root):
            raise
    return write(*args, **kwargs)


def _journal_quietly(root, event, **fields):
    """For the guardian and error paths: a full disk must not stop a rollback."""
    try:
        _journal(root, event, **fields)
    except OSError:
        pass


def _release(state, rid):
    for rel in state["releases"]:
        if rel["id"] == rid:
            return rel
    return None


def _current_target(root):
    try:
        return os.readlink(os.path.join(root, "current"))
    except OSError:
        return None


def _ensure_root(root):
    try:
        os.makedirs(os.path.join(root, "releases"), exist_ok=True)
        os.makedirs(os.path.join(root, "base"), exist_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_failure(root, exc, "creating the release root") from None
        raise Failure("cannot create release root %s: %s" % (root, exc.strerror), "root") from None


def _free_mb(root):
    try:
        st = os.statvfs(root)
        return st.f_bavail * st.f_frsize / 1e6
    except OSError:
        return 0.0


def _disk_failure(root, exc, what, switched=False):
    """The failure of a write: what was being written, and where the host is: "nothing was switched" before any
    switch; after one (``switched``), which release `current` points at and which one the server runs."""
    after = "the host is on %s" % _where(root) if switched else "nothing was switched"
    if exc.errno == errno.ENOSPC:
        return Failure("no space left on the release root %s while %s (%.1f MB free); %s"
                       % (root, what, _free_mb(root), after), "disk")
    if exc.errno == errno.EDQUOT:
        return Failure("disk quota exceeded on %s while %s; %s" % (root, what, after), "disk")
    return Failure("%s failed on %s: %s (%s); %s"
                   % (what, root, exc.strerror or exc, getattr(exc, "filename", ""), after), "io")


def _where(root):
    """Which release `current` points at and which one the tool's server runs, in words."""
    link = _current_target(root)
    on = "the installed package (no overlay)" if link in (None, "base") else "release %s" % os.path.basename(link)
    try:
        record = _server._read_pid(_server._paths(root)[1])
    except Exception:  # a systemd unit, or no pid file: the state of `current` is what we know
        record = None
    if not record:
        return "%s (`current`); no server started by the tool runs there" % on
    serves = record.get("release")
    serves = "release %s" % serves if serves else "the installed package"
    state = "running" if _server._alive(record) else "not running"
    return "%s (`current`); its server (pid %s, %s) serves %s" % (on, record.get("pid"), state, serves)


def _has_baseline(root):
    # the probe's generation baseline lives in the release root (probe.py: baseline_path); reported with the lock
    # so a deploy learns whether it must record one without another round trip
    return os.path.isfile(os.path.join(root, "probe-baseline.json"))


class _OpLock:
    """flock on <root>/.oplock for one step that changes the host. Never nested in one process."""

    def __init__(self, root, wait=True):
        self.root, self.wait, self.fd = root, wait, None

    def __enter__(self):
        try:
            os.makedirs(self.root, exist_ok=True)
            self.fd = os.open(os.path.join(self.root, ".oplock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _disk_failure(self.root, exc, "taking the host lock") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        return False


def _flip(root, release_id):
    """Point `current` at the release (or the empty base) with one rename."""
    target = os.path.join("releases", release_id) if release_id is not None else "base"
    current = os.path.join(root, "current")
    tmp = os.path.join(root, ".current-%d" % os.getpid())
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, current)
    except OSError as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise _disk_failure(root, exc, "switching current") from None
    return target


def _set_status(state, release_id, status, note):
    rel = _release(state, release_id)
    if rel is None:
        raise Failure("no release %s on this host" % release_id, "missing")
    rel["status"] = status
    if note:
        rel["note"] = note
    not_good = ("bad", "interrupted")
    if status in not_good and release_id not in state["bad"]:
        state["bad"].append(release_id)
    if status not in not_good and release_id in state["bad"]:
        state["bad"].remove(release_id)
    return rel
