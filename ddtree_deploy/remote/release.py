# ruff: noqa: F821  (Failure, _json, _sys, _MODULES and the _-helpers come from _frame.py, glued in front of this program)
# requires: server probe
# Release operations on the host: build a release from a staged overlay, switch `current`, keep state, and hold the
# per-host lock through a guardian process that rolls the host back on its own when the control side goes away.
# Stdlib only; runs under the host's own Python (the one SGLang runs under), so byte-compiling here uses the exact
# interpreter and magic number the server will use.
#
# Layout under the release root:
#   releases/<id>/sglang/...        hard-link copy of the installed package, overlay files written by REPLACING links
#   releases/<id>/sglang-*.dist-info hard-link copy, so importlib.metadata still answers from the release
#   releases/<id>/RELEASE.json      patch set, versions, base snapshot, overlay hashes
#   base/                           empty directory: what `current` points at when no overlay is active
#   current -> releases/<id> | base switched atomically (symlink to a temp name, then rename over `current`)
#   state.json                      releases, active, previous_good, bad, pending (rewritten atomically)
#   journal.log                     append-only, one JSON object per line
#   lock                            who holds the per-host lock: a record naming the run and its holder process
#   .oplock                         flock serialising the steps that change the host (and the guardian's rollback)
#   staging/<run>/                  where the overlay tar stream lands before `build`
#
# The transaction (docs/design.md, "The deploy transaction"): `pending` in state.json is written BEFORE `current`
# moves to a release that has not passed its probe, and names the release to go back to ("safe"). It is cleared only
# by the verdict (finish) or by a rollback that reached the safe release. The lock's holder process (`hold`, one per
# run, on the run's own SSH connection) sees the control side vanish (end of input, its sshd gone, or no heartbeat)
# and then settles any pending switch itself: back to the safe release, server restarted on it, lock released.
# Every step of a run passes `fence=<run id>` and is refused once that run no longer holds a live lock.
import errno
import fcntl
import os
import py_compile
import select
import shutil
import signal
import socket
import stat
import time

STATE_VERSION = 1
_server = _MODULES["server"]
_probe = _MODULES["probe"]


# -- state, journal ----------------------------------------------------------------------------------------------------
def _load_state(root):
    path = os.path.join(root, "state.json")
    try:
        with open(path) as fh:
            state = _json.load(fh)
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
    _write_atomic(os.path.join(root, "state.json"), (_json.dumps(state, indent=1, sort_keys=True) + "\n").encode())


def _journal(root, event, **fields):
    entry = {"time": _now(), "event": event, "host": socket.gethostname()}
    entry.update(fields)
    line = _json.dumps(entry, sort_keys=True) + "\n"
    fd = os.open(os.path.join(root, "journal.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


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


def _disk_failure(root, exc, what):
    if exc.errno == errno.ENOSPC:
        return Failure("no space left on the release root %s while %s (%.1f MB free); nothing was switched"
                       % (root, what, _free_mb(root)), "disk")
    if exc.errno == errno.EDQUOT:
        return Failure("disk quota exceeded on %s while %s; nothing was switched" % (root, what), "disk")
    return Failure("%s failed on %s: %s (%s); nothing was switched"
                   % (what, root, exc.strerror or exc, getattr(exc, "filename", "")), "io")


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


# -- the lock ------------------------------------------------------------------------------------------------------------
def _lock_path(root):
    return os.path.join(root, "lock")


def _read_lock(root):
    try:
        with open(_lock_path(root)) as fh:
            return _json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": True}


def _lock_state(rec):
    """free | live (its holder process runs) | dead (its holder is provably gone) | legacy (no holder recorded) |
    unreadable."""
    if rec is None:
        return "free"
    if rec.get("unreadable"):
        return "unreadable"
    if not rec.get("holder_pid"):
        return "legacy"
    if rec.get("host_boot_id") and rec.get("host_boot_id") != _boot_id():
        return "dead"
    return "live" if _proc_alive(rec.get("holder_pid"), rec.get("holder_ticks")) else "dead"


def _why_dead(rec):
    if rec.get("host_boot_id") and rec.get("host_boot_id") != _boot_id():
        return "the host has rebooted since run %s took the lock" % rec.get("run_id")
    return "the lock's holder process (pid %s) of run %s is gone" % (rec.get("holder_pid"), rec.get("run_id"))


def _take_lock(root, owner, break_lock):
    """Create the lock record for ``owner`` (a run), or report the holder. A lock whose holder is provably dead is
    taken over (and said so); a live one only with ``break_lock``, which also stops the old holder."""
    path = _lock_path(root)
    record = dict(owner)
    record.update({"taken": _now(), "host_boot_id": _boot_id(), "holder_pid": os.getpid(),
                   "holder_ticks": _proc_start_ticks(os.getpid()), "host_conn_pid": _PPID0})
    data = (_json.dumps(record, sort_keys=True) + "\n").encode()
    tmp = "%s.%d.%s" % (path, os.getpid(), owner.get("run_id", ""))
    try:
        # write the record under a private name, then hard-link it to `lock`: link() fails if `lock` exists, so
        # taking the lock and its content appear at once (a rival never reads a half-written lock)
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise _disk_failure(root, exc, "taking the host lock") from None
        try:
            os.link(tmp, path)
            return {"acquired": True, "recovered": None, "broken": None}
        except FileExistsError:
            pass
        holder = _read_lock(root)
        state = _lock_state(holder)
        rebooted = bool(holder and holder.get("host_boot_id")) and holder.get("host_boot_id") != _boot_id()
        if state == "free":  # released between our link() and the read: try once more
            try:
                os.link(tmp, path)
                return {"acquired": True, "recovered": None, "broken": None}
            except FileExistsError:
                holder, state = _read_lock(root), "live"
        if state == "live" and holder.get("abandoned"):
            return {"acquired": False, "holder": holder, "settling": True}
        if state in ("live", "legacy", "unreadable") and not break_lock:
            return {"acquired": False, "holder": holder, "host_rebooted": rebooted, "lock_state": state}
        try:  # taking over: one contender at a time, and never while a step of the old run is half way
            with _OpLock(root, wait=False):
                if _read_lock(root) != holder:
                    return {"acquired": False, "holder": _read_lock(root), "host_rebooted": False, "lock_state": "live"}
                if state == "live":  # --break-lock on a live run: its holder goes first, so it cannot act later
                    try:
                        os.kill(holder["holder_pid"], signal.SIGKILL)
                    except OSError:
                        pass
                os.replace(tmp, path)
        except BlockingIOError:
            return {"acquired": False, "holder": holder, "host_rebooted": rebooted, "lock_state": "busy"}
        if state == "dead" and not break_lock:
            _journal(root, "lock-recovered", run=owner.get("run_id"), previous=holder, why=_why_dead(holder))
            return {"acquired": True, "recovered": holder, "recovered_why": _why_dead(holder), "broken": None}
        _journal(root, "lock-broken", run=owner.get("run_id"), previous=holder)
        return {"acquired": True, "recovered": None, "broken": holder}
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _unlock(root, run_id):
    rec = _read_lock(root)
    if rec is None:
        return {"released": False, "reason": "no lock"}
    if rec.get("run_id") != run_id:
        return {"released": False, "reason": "held by %s" % rec.get("run_id")}
    os.unlink(_lock_path(root))
    return {"released": True}


def _fence(root, fence):
    """Refuse a step of run ``fence`` unless that run still holds a live lock (None: a caller outside any run)."""
    if fence is None:
        return None
    if _control_lost():
        raise Failure("the control side's connection was lost; step of run %s not taken (the lock's holder settles "
                      "the run)" % fence, "fenced")
    rec = _read_lock(root)
    if not rec or rec.get("run_id") != fence:
        raise Failure("run %s no longer holds the deploy lock of %s (%s); refusing to change the host"
                      % (fence, root, "held by run %s" % rec.get("run_id") if rec else "no lock"), "fenced")
    if rec.get("abandoned"):
        raise Failure("run %s was given up on the host (%s) and is being rolled back there; refusing to change the "
                      "host" % (fence, rec["abandoned"].get("reason")), "fenced")
    if _lock_state(rec) != "live":
        raise Failure("run %s lost the deploy lock of %s (%s); refusing to change the host" % (fence, root, _why_dead(rec)),
                      "fenced")
    return rec


def _read_commands(lease_timeout):
    """Lines from the control side on fd 0 until "release", the end of input, a lost sshd or a missed heartbeat.
    Returns None for "release", else why the control side is gone."""
    buf = b""
    last = time.time()
    while True:
        if _control_lost():
            return "the control side's SSH session ended (connection cut)"
        ready, _, _ = select.select([0], [], [], 0.5)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                return "the control side's connection closed (end of input)"
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode("utf-8", "replace").strip()
                if cmd == "release":
                    return None
                if cmd.startswith("abandon"):
                    return cmd[len("abandon"):].strip() or "abandoned by the control side"
                last = time.time()  # "hb" or anything else: the control side is alive
        elif time.time() - last > lease_timeout:
            return "no heartbeat from the control side for %.0f s" % lease_timeout


def hold(root, owner, break_lock=False, guard=None, lease_timeout=30.0):
    """Session op: take the host lock for run ``owner["run_id"]`` and hold it while the control side is there.

    First reply: {acquired, state, has_baseline, recovered|broken, ...} (or who holds it). Then it reads command
    lines: "hb" (heartbeat), "release" (end of the run: the lock is released), "abandon <why>" (the control side
    was interrupted). On "abandon", end of input or a missed heartbeat it settles the run itself (see _settle) with
    ``guard`` (the server spec and start-up check), releases the lock and says what it did in its final reply."""
    _ensure_root(root)
    got = _take_lock(root, owner, break_lock)
    if not got["acquired"]:
        return got
    rid = owner.get("run_id")
    state = _load_state(root)
    got.update({"state": state, "has_baseline": _has_baseline(root), "boot_id": _boot_id()})
    _emit({"ok": True, "result": got})
    why = _read_commands(float(lease_timeout))
    with _OpLock(root):  # waits for a step of this run that is half way
        if why is None:
            if not (_load_state(root).get("pending") or {}).get("run") == rid:
                return {"released": _unlock(root, rid)["released"]}
            why = "the run ended with a release still unprobed"
        return _abandon(root, rid, why, guard)


def _abandon(root, rid, why, guard):
    rec = _read_lock(root)
    if not rec or rec.get("run_id") != rid:
        return {"abandoned": why, "action": "none", "detail": "the lock was taken over by run %s" % (rec or {}).get("run_id")}
    rec["abandoned"] = {"reason": why, "since": _now()}
    try:
        _write_atomic(_lock_path(root), (_json.dumps(rec, sort_keys=True) + "\n").encode())
    except OSError:
        pass  # the abandoned flag only tells other commands to wait; the lock is still ours
    _journal_quietly(root, "abandon", run=rid, reason=why)
    try:
        outcome = _settle(root, rid, why, guard, by="guardian")
    except Failure as exc:
        outcome = {"action": "failed", "detail": str(exc)}
        _journal_quietly(root, "reconciled", run=rid, by="guardian", outcome="failed", detail=str(exc)[:500])
    except Exception as exc:  # never leave the lock behind because of a bug here; say what happened
        outcome = {"action": "failed", "detail": "%s: %s" % (type(exc).__name__, exc)}
        _journal_quietly(root, "reconciled", run=rid, by="guardian", outcome="failed", detail=outcome["detail"][:500])
    _unlock(root, rid)
    return dict(outcome, abandoned=why)


# -- settling a run that stopped early ------------------------------------------------------------------------------------------
def _settle(root, rid, why, guard, by):
    """Bring the host back to its last good release after run ``rid`` stopped early (or left a pending switch behind
    that nobody settled: after a reboot, ``rid`` is the run named in `pending`). Leftovers of the run (staging,
    half-built and never-switched releases) are removed; a pending switch is undone: `current` back to the safe
    release, the unprobed release marked "interrupted", the server restarted on the safe release when it ran (or may
    have run) anything else, and /health waited for. Returns what was done, for the journal and the user."""
    state = _load_state(root)
    pend = state.get("pending")
    removed = _remove_leftovers(root, rid, state)
    rec = _read_lock(root) or {}
    out = {"action": "none", "removed": removed, "by": by}
    if pend:
        target = pend.get("safe")
        failed = pend.get("release") if pend.get("release") != target else None
        restart = bool(guard) and _needs_restart(root, pend, target, guard)
        res = _roll_back_steps(root, rid, target, failed, "interrupted", "interrupted: %s" % why, guard if restart else None)
        out.update(action="rolled-back", release=pend.get("release"), to=target, restarted=restart, switch=res)
        if restart:
            out["health"] = _health(root, guard)
        state = _load_state(root)
        state["pending"] = None
        _save_state(root, state)
    elif guard and rec.get("server_touched") and rec.get("run_id") == rid:
        # the run changed the server without switching (a baseline recording): put it back as configured
        active = state["active"]
        _server.control(root, guard, "restart", active, active is not None)
        out.update(action="server-restored", to=active, restarted=True, health=_health(root, guard))
    _journal_quietly(root, "reconciled", run=rid, by=by, why=why[:300], outcome=out["action"], to=out.get("to"),
                     release=out.get("release"), removed=removed, health=(out.get("health") or {}).get("state"))
    return out


def _needs_restart(root, pend, target, guard):
    if pend.get("server_touched"):
        return True
    if guard.get("kind") == "systemd":
        return not _server.running(root, guard)
    record = _server._read_pid(_server._paths(root)[1])
    return not _server._alive(record) or record.get("release") != target


def _health(root, guard):
    """The start-up check of the guardian's restart: /health within the start-up budget, the no-progress rule on."""
    try:
        got = _probe._wait_ready(guard["pid_source"], guard["log_source"], guard["health_url"],
                                 float(guard.get("startup_timeout", 600.0)), 0.1, 5.0, float(guard.get("stall", 0.0)))
    except Exception as exc:
        return {"state": "error", "detail": str(exc)}
    return {"state": got["state"], "seconds": got["seconds"], "pid": got.get("pid")}


def _remove_leftovers(root, rid, state):
    """Staging dirs, half-built releases, and releases of ``rid`` that were built but never switched in."""
    removed = []
    shutil.rmtree(os.path.join(root, "staging", rid), ignore_errors=True)
    rel_dir = os.path.join(root, "releases")
    for entry in os.listdir(rel_dir) if os.path.isdir(rel_dir) else []:
        if entry.startswith(".partial-"):
            shutil.rmtree(os.path.join(rel_dir, entry), ignore_errors=True)
    keep = {state.get("active"), state.get("previous_good"), (state.get("pending") or {}).get("release")}
    for rel in list(state["releases"]):
        if rel.get("status") == "pushed" and rel.get("run") == rid and rel["id"] not in keep:
            shutil.rmtree(os.path.join(rel_dir, rel["id"]), ignore_errors=True)
            state["releases"].remove(rel)
            removed.append(rel["id"])
    if removed:
        _save_state(root, state)
    return removed


def _roll_back_steps(root, run_id, target, failed, failed_status, note, spec):
    """The one rollback of the tool (probe failed, interrupted run, rollback by hand): mark ``failed``, record the
    move as pending (safe = ``target``), point `current` at ``target``, and restart the server there when ``spec``
    is given. `pending` stays until the caller's verdict on ``target`` (finish) clears it."""
    state = _load_state(root)
    previous = state["active"]
    if target is not None and (_release(state, target) is None or not os.path.isdir(os.path.join(root, "releases", target))):
        raise Failure("cannot roll back to %s: no such release on this host (have: %s)"
                      % (target, ", ".join(r["id"] for r in state["releases"]) or "none"), "missing")
    if failed and _release(state, failed) is not None:
        _set_status(state, failed, failed_status, note)
    state["pending"] = {"release": target, "safe": target, "run": run_id, "stage": "rolling-back", "since": _now(),
                        "server_touched": bool(spec), "from": previous}
    _save_state(root, state)
    _flip(root, target)
    state["active"] = target
    _save_state(root, state)
    _journal_quietly(root, "switch", run=run_id, reason="rollback", **{"from": previous, "to": target})
    if failed:
        _journal_quietly(root, "mark", run=run_id, release=failed, status=failed_status, note=note[:500])
    restarted = None
    if spec:
        restarted = _server.control(root, spec, "restart", target, target is not None)
    return {"from": previous, "to": target, "restarted": restarted}


# -- build -----------------------------------------------------------------------------------------------------------
def _link_tree(src, dst, mode):
    """Copy ``src`` to ``dst`` as hard links (``mode`` "hardlink"), falling back to real copies across devices."""
    for dirpath, _dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(target_dir, exist_ok=True)
        for name in filenames:
            s = os.path.join(dirpath, name)
            d = os.path.join(target_dir, name)
            if os.path.islink(s):
                os.symlink(os.readlink(s), d)
                continue
            if mode[0] == "hardlink":
                try:
                    os.link(s, d)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
                    mode[0] = "copy"
            shutil.copy2(s, d)


def _purge_pycache(path):
    """Remove every cached bytecode of ``path`` (all interpreters, all optimisation levels)."""
    directory, name = os.path.split(path)
    stem = os.path.splitext(name)[0]
    cache = os.path.join(directory, "__pycache__")
    removed = []
    if os.path.isdir(cache):
        for entry in os.listdir(cache):
            if entry.startswith(stem + ".") and entry.endswith(".pyc"):
                os.unlink(os.path.join(cache, entry))
                removed.append(entry)
    return removed


def _installed_version(site_packages, package):
    for entry in sorted(os.listdir(site_packages)):
        if entry.endswith(".dist-info") and entry.startswith(package + "-"):
            try:
                with open(os.path.join(site_packages, entry, "METADATA"), encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                continue
    return None


def base_drift(site_packages, package, files, base_hashes, base_version=None):
    """How the installed package differs from the snapshot the overlay was built from, for the files the overlay
    writes: a replaced file whose sha256 is not the snapshot's, an added file that now exists, another installed
    version. Empty when the overlay's base is what is installed."""
    problems = []
    installed = _installed_version(site_packages, package)
    if base_version and installed and installed != base_version:
        problems.append("%s %s is installed, the overlay was built for %s" % (package, installed, base_version))
    for f in files:
        path = os.path.join(site_packages, f["path"])
        want = (base_hashes or {}).get(f["path"])
        if f["action"] == "replace" and want:
            try:
                got = _sha256_file(path)
            except OSError:
                problems.append("%s: missing on the host" % f["path"])
                continue
            if got != want:
                problems.append("%s: sha256 %s on the host, %s in the snapshot" % (f["path"], got[:12], want[:12]))
        elif f["action"] == "add" and base_hashes is not None and os.path.lexists(path):
            problems.append("%s: the overlay adds it, but the installed package now has it" % f["path"])
    return problems


def build(root, site_packages, package, release_id, staging, files, meta, keep=5, base_hashes=None,
          allow_base_drift=False, fence=None):
    """Make ``releases/<release_id>`` from the installed package plus the staged overlay files; never switch.

    ``files``: [{path, sha256, mode, action}] relative to site-packages. Every staged file is verified against
    its hash first (a cut or corrupted transfer fails here), then every installed file the overlay replaces against
    ``base_hashes`` (the snapshot it was built from: drift is refused unless ``allow_base_drift``); a syntax error
    in a changed .py fails the build. The release is committed (renamed into place, recorded in state.json) only
    while run ``fence`` still holds the lock and its SSH session is alive: a build orphaned by a cut connection
    removes its work instead. On any failure the partial release and the staging dir are removed and state.json is
    untouched."""
    _ensure_root(root)
    installed = os.path.join(site_packages, package)
    if not os.path.isdir(installed):
        raise Failure("installed package not found: %s" % installed, "missing")
    final = os.path.join(root, "releases", release_id)
    if os.path.exists(final):
        raise Failure("release %s already exists on the host" % release_id, "exists")
    partial = os.path.join(root, "releases", ".partial-" + release_id)
    started = time.time()
    mode = ["hardlink"]
    drift = []
    try:
        _fence(root, fence)
        _clean_stale(root, keep=os.path.basename(staging.rstrip("/")))
        for f in files:
            staged = os.path.join(staging, f["path"])
            if not os.path.isfile(staged):
                raise Failure("staged overlay file missing: %s (transfer incomplete?)" % f["path"], "transfer")
            got = _sha256_file(staged)
            if got != f["sha256"]:
                raise Failure("staged overlay file %s has sha256 %s, expected %s (transfer corrupted)"
                              % (f["path"], got[:12], f["sha256"][:12]), "transfer")
        drift = base_drift(site_packages, package, files, base_hashes, meta.get("base_version") if base_hashes is not None else None)
        if drift and not allow_base_drift:
            raise Failure("the installed %s changed since snapshot %s was taken (%d file(s) the overlay writes differ):\n  %s"
                          % (package, meta.get("base_snapshot") or "?", len(drift), "\n  ".join(drift[:8])), "drift")
        _fault_point(root, "build:verified")
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        _link_tree(installed, os.path.join(partial, package), mode)
        dist_infos = []
        for entry in sorted(os.listdir(site_packages)):
            if entry.endswith(".dist-info") and entry.startswith(package + "-"):
                _link_tree(os.path.join(site_packages, entry), os.path.join(partial, entry), mode)
                dist_infos.append(entry)
        changed, purged = [], []
        for f in files:
            dest = os.path.join(partial, f["path"])
            exists = os.path.lexists(dest)
            if f["action"] == "replace" and not exists:
                raise Failure("overlay replaces %s but the installed package has no such file" % f["path"], "mismatch")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = os.path.join(os.path.dirname(dest), ".ddtree-new-" + os.path.basename(dest))
            shutil.copyfile(os.path.join(staging, f["path"]), tmp)
            os.chmod(tmp, int(f.get("mode", 0o644)))
            os.replace(tmp, dest)  # replaces the hard link; the installed file is never written through
            if dest.endswith(".py"):
                purged += [os.path.join(os.path.dirname(f["path"]), "__pycache__", p) for p in _purge_pycache(dest)]
                changed.append(dest)
        for dest in changed:
            try:
                py_compile.compile(dest, doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            except py_compile.PyCompileError as exc:
                rel = os.path.relpath(dest, partial)
                raise Failure("overlay file %s does not compile under %s: %s"
                              % (rel, _sys.executable, exc.msg.strip().splitlines()[-1]), "syntax") from None
        record = dict(meta)
        record.update({
            "id": release_id, "created": _now(), "package": package, "installed_from": installed,
            "link_mode": mode[0], "dist_info": dist_infos, "purged_pycache": purged,
            "compiled_by": _sys.executable, "python": "%d.%d.%d" % _sys.version_info[:3], "base_drift": drift,
        })
        _write_atomic(os.path.join(partial, "RELEASE.json"), (_json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        _fault_point(root, "build:linked")
        with _OpLock(root):  # the commit: only for a run that still holds the lock and is still connected
            if _control_lost():
                raise Failure("the control side's connection was lost before release %s was committed; "
                              "its files were removed" % release_id, "cut")
            _fence(root, fence)
            state = _load_state(root)
            os.rename(partial, final)
            state["releases"].append({"id": release_id, "created": record["created"], "status": "pushed", "run": meta.get("run_id"),
                                      "patchset": meta.get("patchset"), "patchset_version": meta.get("patchset_version"),
                                      "base_version": meta.get("base_version"), "overlay_digest": meta.get("overlay_digest")})
            try:
                _save_state(root, state)
            except BaseException:
                shutil.rmtree(final, ignore_errors=True)
                raise
            _journal(root, "push", release=release_id, run=meta.get("run_id"), by=meta.get("pushed_by"),
                     patchset=meta.get("patchset"), patchset_version=meta.get("patchset_version"),
                     base_version=meta.get("base_version"), base_snapshot=meta.get("base_snapshot"),
                     digest=meta.get("overlay_digest"), link_mode=mode[0], abi_ignored=meta.get("abi_ignored"),
                     base_drift=drift or None)
        _fault_point(root, "build:committed")
    except Failure:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise _disk_failure(root, exc, "building release %s" % release_id) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"id": release_id, "path": final, "link_mode": mode[0], "seconds": round(time.time() - started, 3),
            "files": len(files), "purged_pycache": purged, "base_drift": drift}


def _clean_stale(root, keep):
    """Remove staging dirs and half-built releases left by dead runs (we hold the lock, so nobody else is busy)."""
    base = os.path.join(root, "staging")
    if os.path.isdir(base):
        for entry in os.listdir(base):
            if entry != keep:
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)
    rel = os.path.join(root, "releases")
    for entry in os.listdir(rel):
        if entry.startswith(".partial-"):
            shutil.rmtree(os.path.join(rel, entry), ignore_errors=True)


def discard_staging(path):
    shutil.rmtree(path, ignore_errors=True)
    return True


# -- switch, mark, state -------------------------------------------------------------------------------------------------
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


def switch(root, release_id, run_id=None, reason="deploy", mark_bad=None, note="", fence=None, probing=False):
    """Point ``current`` at ``releases/<release_id>`` (or at the empty ``base`` dir for None) atomically.
    ``mark_bad``: a release to mark bad in the same step. ``probing``: the release has not passed its probe yet:
    `pending` (with the release we leave as the safe one) is on disk before `current` moves."""
    _ensure_root(root)
    with _OpLock(root):
        _fence(root, fence)
        state = _load_state(root)
        if mark_bad:
            _set_status(state, mark_bad, "bad", note)
        if release_id is not None:
            rel = _release(state, release_id)
            if rel is None or not os.path.isdir(os.path.join(root, "releases", release_id)):
                raise Failure("no release %s on this host (have: %s)"
                              % (release_id, ", ".join(r["id"] for r in state["releases"]) or "none"), "missing")
        previous = state["active"]
        prev_rel = _release(state, previous) if previous else None
        if probing:
            state["pending"] = {"release": release_id, "safe": previous, "run": run_id, "stage": "switched",
                                "since": _now(), "server_touched": False, "reason": reason}
            _set_status(state, release_id, "probing", "")
            _save_state(root, state)  # the intent is on disk before `current` moves
            _fault_point(root, "switch:pending")
        target = _flip(root, release_id)
        _fault_point(root, "switch:flipped")
        if previous != release_id:
            # "previous good" is what we go back to when this release fails its probe: the release we leave if it
            # was good (or the installed package), else whatever was previous good before it.
            if previous is None or (prev_rel is not None and prev_rel.get("status") == "good"):
                state["previous_good"] = previous
        state["active"] = release_id
        _save_state(root, state)
        _journal(root, "switch", run=run_id, reason=reason, **{"from": previous, "to": release_id})
        if mark_bad:
            _journal(root, "mark", run=run_id, release=mark_bad, status="bad", note=note)
    return {"from": previous, "to": release_id, "previous_good": state["previous_good"], "target": target}


def roll_back(root, target, failed=None, run_id=None, note="", spec=None, fence=None, failed_status="bad"):
    """Op: back to ``target`` (None: the installed package), marking ``failed``; restart the server there when
    ``spec`` is given. `pending` names ``target`` until the caller's probe verdict (finish)."""
    _ensure_root(root)
    with _OpLock(root):
        _fence(root, fence)
        return _roll_back_steps(root, run_id, target, failed, failed_status, note, spec)


def reconcile(root, run_id, why, guard=None, fence=None):
    """Op: settle a pending switch left by a run that is gone (the guardian could not: a reboot, a killed holder)."""
    with _OpLock(root):
        _fence(root, fence)
        pend = _load_state(root).get("pending")
        if not pend:
            return {"action": "none"}
        out = _settle(root, pend.get("run") or run_id, why, guard, by="run %s" % run_id)
        return dict(out, pending=pend)


def server_action(root, spec, action, release=None, ddtree=True, fence=None):
    """Op: start | stop | restart the server (server.control) as a step of run ``fence``. Inside a pending switch
    the switch records that the server was touched, so an interruption restarts it on the safe release."""
    with _OpLock(root):
        rec = _fence(root, fence)
        if rec is not None:
            state = _load_state(root)
            pend = state.get("pending")
            if pend and pend.get("run") == fence:
                pend.update(server_touched=True, stage="restarting" if action != "stop" else "stopping")
                _save_state(root, state)
            elif not rec.get("server_touched"):
                rec["server_touched"] = True
                _write_atomic(_lock_path(root), (_json.dumps(rec, sort_keys=True) + "\n").encode())
        _fault_point(root, "server:" + action)
        res = _server.control(root, spec, action, release, ddtree)
        if rec is not None:
            state = _load_state(root)
            pend = state.get("pending")
            if pend and pend.get("run") == fence and action != "stop":
                pend["stage"] = "probing"
                _save_state(root, state)
        return res


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


def mark(root, release_id, status, run_id=None, note="", fence=None):
    """Record a probe verdict: status "good" or "bad" (bad releases are never chosen as rollback targets)."""
    with _OpLock(root):
        _fence(root, fence)
        state = _load_state(root)
        rel = _set_status(state, release_id, status, note)
        _save_state(root, state)
        _journal(root, "mark", run=run_id, release=release_id, status=status, note=note)
    return rel


def finish(root, release_id, status, keep, run_id, event, fields, note="", fence=None):
    """End of a run's transaction in one round trip: the verdict on ``release_id`` (if any), the pending switch
    cleared, old releases pruned, a journal line. The lock is released by the run's holder afterwards."""
    with _OpLock(root):
        _fence(root, fence)
        _fault_point(root, "finish")
        state = _load_state(root)
        if release_id and status:
            _set_status(state, release_id, status, note)
            _journal(root, "mark", run=run_id, release=release_id, status=status, note=note)
        pend = state.get("pending")
        if pend and (pend.get("run") == run_id or pend.get("release") == release_id):
            state["pending"] = None
        _save_state(root, state)
        removed = _cleanup(root, keep, run_id)
        entry = dict(fields)
        entry["run"] = run_id
        _journal(root, event, **entry)
    return {"removed": removed}


def journal(root, event, fields):
    _ensure_root(root)
    _journal(root, event, **fields)
    return True


def show(root, journal_lines=0):
    """State, the `current` link, the lock (and whether its holder lives) and (optionally) the journal tail."""
    state = _load_state(root)
    lock_info = _read_lock(root)
    for rel in state["releases"]:
        rel["exists"] = os.path.isdir(os.path.join(root, "releases", rel["id"]))
    lines = []
    if journal_lines:
        try:
            with open(os.path.join(root, "journal.log")) as fh:
                lines = [_json.loads(ln) for ln in fh.read().splitlines()[-journal_lines:] if ln.strip()]
        except OSError:
            lines = []
    return {"root": root, "state": state, "current": _current_target(root), "lock": lock_info,
            "lock_state": _lock_state(lock_info), "boot_id": _boot_id(), "journal": lines, "root_exists": os.path.isdir(root)}


def read_release(root, release_id):
    with open(os.path.join(root, "releases", release_id, "RELEASE.json")) as fh:
        return _json.load(fh)


def _cleanup(root, keep, run_id=None):
    state = _load_state(root)
    protected = {state["active"], state["previous_good"], (state.get("pending") or {}).get("release")}
    ordered = list(state["releases"])
    removable = [r for r in ordered if r["id"] not in protected]
    excess = len(ordered) - keep
    removed = []
    for rel in removable:
        if excess <= 0:
            break
        shutil.rmtree(os.path.join(root, "releases", rel["id"]), ignore_errors=True)
        state["releases"].remove(rel)
        if rel["id"] in state["bad"]:
            state["bad"].remove(rel["id"])
        removed.append(rel["id"])
        excess -= 1
    if removed:
        _save_state(root, state)
        _journal(root, "cleanup", run=run_id, removed=removed)
    return removed


def cleanup(root, keep, run_id=None, fence=None):
    """Keep the newest ``keep`` releases; never remove the active one, the rollback target or a pending one."""
    with _OpLock(root):
        _fence(root, fence)
        return {"removed": _cleanup(root, keep, run_id)}


def package_manifest(site_packages, package):
    """sha256, size and mode of every file of the installed package: proves it is never modified."""
    base = os.path.join(site_packages, package)
    out = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, site_packages)] = [_sha256_file(path) if stat.S_ISREG(st.st_mode) else "link",
                                                        st.st_size, st.st_mode, int(st.st_mtime)]
    return out


OPS = {
    "hold": hold, "build": build, "discard_staging": discard_staging, "switch": switch, "roll_back": roll_back,
    "reconcile": reconcile, "server_action": server_action, "mark": mark, "finish": finish, "journal": journal,
    "show": show, "read_release": read_release, "cleanup": cleanup, "package_manifest": package_manifest,
}
