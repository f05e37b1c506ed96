"""The per-host lock, held by a guardian process for the run that took it (`hold`), the fence every step of a run
passes, and settling a run that stopped early (the one rollback: _roll_back_steps). A part of the release ops
(release.py); see docs/design.md, "The deploy transaction". Stdlib only."""
import json
import os
import select
import shutil
import signal
import time

from . import probe as _probe
from . import server as _server
from ._frame import (_PPID0, Failure, _boot_id, _control_lost, _emit, _fault_point, _now, _proc_alive,
                     _proc_start_ticks, _write_json)
from ._state import (_OpLock, _disk_failure, _ensure_root, _flip, _has_baseline, _journal, _journal_quietly,
                     _load_state, _release, _save_state, _set_status)


# -- the lock ------------------------------------------------------------------------------------------------------------
def _lock_path(root):
    return os.path.join(root, "lock")


def _read_lock(root):
    try:
        with open(_lock_path(root)) as fh:
            return json.load(fh)
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
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
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


def _read_commands(lease_timeout, fd=0):
    """Lines from the control side on ``fd`` (our stdin, after the request the boot line read) until "release", the
    end of input, a lost sshd or a missed heartbeat.
    Returns (None, False) for "release", else (why the control side is gone, whether it said so itself: an
    "abandon" from a tool that is alive and reports the settlement)."""
    buf = b""
    last = time.time()
    while True:
        if _control_lost():
            return "the control side's SSH session ended (connection cut)", False
        ready, _, _ = select.select([fd], [], [], min(0.5, lease_timeout))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return "the control side's connection closed (end of input)", False
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode("utf-8", "replace").strip()
                if cmd == "release":
                    return None, False
                if cmd.startswith("abandon"):
                    return cmd[len("abandon"):].strip() or "abandoned by the control side", True
                last = time.time()  # "hb" or anything else: the control side is alive
        elif time.time() - last > lease_timeout:
            return "no heartbeat from the control side for %.0f s" % lease_timeout, False


def hold(root, owner, break_lock=False, guard=None, lease_timeout=30.0):
    """Session op: take the host lock for run ``owner["run_id"]`` and hold it while the control side is there.

    First reply: {acquired, state, has_baseline, recovered|broken, holder_pid, ...} (or who holds it; holder_pid is
    this process, the lock record's holder: the control side tells its own dead guardian by it). Then it reads command
    lines: "hb" (heartbeat), "release" (end of the run: the lock is released), "abandon <why>" (the control side
    was interrupted). On "abandon", end of input or a missed heartbeat it settles the run itself (see _settle) with
    ``guard`` (the server spec and start-up check), releases the lock and says what it did in its final reply."""
    _ensure_root(root)
    got = _take_lock(root, owner, break_lock)
    if not got["acquired"]:
        return got
    rid = owner.get("run_id")
    state = _load_state(root)
    got.update({"state": state, "has_baseline": _has_baseline(root), "boot_id": _boot_id(),
                "untold": _untold_settlement(root, rid), "holder_pid": os.getpid(),
                "holder_ticks": _proc_start_ticks(os.getpid())})
    _emit({"ok": True, "result": got})
    why, asked = _read_commands(float(lease_timeout))
    with _OpLock(root):  # waits for a step of this run that is half way
        if why is None:
            if not (_load_state(root).get("pending") or {}).get("run") == rid:
                return {"released": _unlock(root, rid)["released"]}
            why = "the run ended with a release still unprobed"
        return _abandon(root, rid, why, guard, told=asked)


def _untold_settlement(root, rid):
    """The guardian's settlement of an earlier run that no command has reported yet (its tool was killed or cut off
    and never saw it), from the journal's tail; journalled as told, so the next command says it once."""
    try:
        with open(os.path.join(root, "journal.log"), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - (64 << 10)))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "told":
            return None
        if entry.get("event") == "reconciled" and entry.get("by") == "guardian":
            _journal_quietly(root, "told", run=rid, about=entry.get("run"))
            return entry
    return None


def _abandon(root, rid, why, guard, told=False):
    rec = _read_lock(root)
    if not rec or rec.get("run_id") != rid:
        return {"abandoned": why, "action": "none", "detail": "the lock was taken over by run %s" % (rec or {}).get("run_id")}
    rec["abandoned"] = {"reason": why, "since": _now()}
    try:
        _write_json(_lock_path(root), rec)
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
    if told:  # the tool that asked is alive and reports this settlement itself (exit 130): not said again later
        _journal_quietly(root, "told", run=rid, about=rid)
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
    out = {"action": "none", "removed": removed, "by": by, "to": state["active"]}
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
    elif guard and ((rec.get("server_touched") and rec.get("run_id") == rid) or _serves_other(root, state["active"], guard)):
        # the run changed the server without switching (a baseline recording), or stopped between moving `current`
        # and restarting the server (a rollback by hand): put it back as configured, on `current`
        active = state["active"]
        _server.control(root, guard, "restart", active, active is not None)
        out.update(action="server-restored", to=active, restarted=True, health=_health(root, guard))
    _journal_quietly(root, "reconciled", run=rid, by=by, why=why[:300], outcome=out["action"], to=out.get("to"),
                     release=out.get("release"), removed=removed, health=(out.get("health") or {}).get("state"))
    return out


def _serves_other(root, active, guard):
    """The tool's server runs, but a release other than `current` (its pid record says which)."""
    if guard.get("kind") == "systemd":
        return False
    record = _server._read_pid(_server._paths(root)[1])
    return _server._alive(record) and record.get("release") != active


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


def _stop_run_processes(root, rid):
    """Kill what is left of run ``rid``'s push on the host (a `tar -x` still unpacking a cut stream into its staging
    dir, the build behind it) and wait until it is gone, so nothing writes there after the cleanup."""
    mark = os.path.join(root, "staging", rid).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                if mark in fh.read():
                    pids.append(int(entry))
        except OSError:
            continue
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.time() + 10
    while pids and time.time() < deadline:
        pids = [p for p in pids if _proc_start_ticks(p) is not None]
        time.sleep(0.02)


def _remove_leftovers(root, rid, state):
    """Staging dirs, half-built releases, and releases of ``rid`` that were built but never switched in."""
    removed = []
    _stop_run_processes(root, rid)
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
    """The one rollback of the tool (probe failed, interrupted run, rollback by hand), in the order of every move of
    `current` (docs/design.md): `current` moves first (a rename, no new disk space), then state.json records it.
    ``failed`` is marked, the move recorded as pending (safe = ``target``: a stop before the restart is settled by
    restarting there), and the server restarted on ``target`` when ``spec`` is given. `pending` stays until the
    caller's verdict on ``target`` (finish) clears it. The state and journal writes fall back on the reserve (see
    _ensure_reserve) when the disk is full; a failure says where the host is."""
    state = _load_state(root)
    previous = state["active"]
    if target is not None and (_release(state, target) is None or not os.path.isdir(os.path.join(root, "releases", target))):
        raise Failure("cannot roll back to %s: no such release on this host (have: %s)"
                      % (target, ", ".join(r["id"] for r in state["releases"]) or "none"), "missing")
    _flip(root, target)
    _fault_point(root, "rollback:flipped")
    try:
        state["active"] = target
        if failed and _release(state, failed) is not None:
            _set_status(state, failed, failed_status, note)
        state["pending"] = {"release": target, "safe": target, "run": run_id, "stage": "rolling-back", "since": _now(),
                            "server_touched": bool(spec), "from": previous}
        _save_state(root, state)
    except OSError as exc:
        raise _disk_failure(root, exc, "recording the rollback to %s" % (target or "the installed package"),
                            switched=True) from None
    _journal_quietly(root, "switch", run=run_id, reason="rollback", **{"from": previous, "to": target})
    if failed:
        _journal_quietly(root, "mark", run=run_id, release=failed, status=failed_status, note=note[:500])
    restarted = None
    if spec:
        restarted = _server.control(root, spec, "restart", target, target is not None)
    return {"from": previous, "to": target, "restarted": restarted}
