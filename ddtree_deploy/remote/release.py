"""Release operations on the host: build a release from a staged overlay, switch `current`, keep state, and hold the
per-host lock through a guardian process that rolls the host back on its own when the control side goes away.
Stdlib only; runs under the host's own Python (the one SGLang runs under), so byte-compiling here uses the exact
interpreter and magic number the server will use.

Layout under the release root:
  releases/<id>/sglang/...        hard-link copy of the installed package, overlay files written by REPLACING links
  releases/<id>/sglang-*.dist-info hard-link copy, so importlib.metadata still answers from the release
  releases/<id>/RELEASE.json      patch set, versions, base snapshot, overlay hashes
  base/                           empty directory: what `current` points at when no overlay is active
  current -> releases/<id> | base switched atomically (symlink to a temp name, then rename over `current`)
  state.json                      releases, active, previous_good, bad, pending (rewritten atomically)
  journal.log                     append-only, one JSON object per line
  lock                            who holds the per-host lock: a record naming the run and its holder process
  .oplock                         flock serialising the steps that change the host (and the guardian's rollback)
  staging/<run>/                  where the overlay tar stream lands before `build`

Its parts are modules of their own, imported here: _state.py (state.json, journal, `current`, the step lock),
_lease.py (the lock, its guardian, the fence, settling a run that stopped early) and _build.py (receive + build a
release, base drift); their ops (hold, receive, discard_staging) are in OPS below.

The transaction (docs/design.md, "The deploy transaction"): `pending` in state.json is written BEFORE `current`
moves to a release that has not passed its probe, and names the release to go back to ("safe"). It is cleared only
by the verdict (finish) or by a rollback that reached the safe release. The lock's holder process (`hold`, one per
run, on the run's own SSH connection) sees the control side vanish (end of input, its sshd gone, or no heartbeat)
and then settles any pending switch itself: back to the safe release, server restarted on it, lock released.
Every step of a run passes `fence=<run id>` and is refused once that run no longer holds a live lock.
"""
import json
import os
import shutil

from . import server as _server
from ._build import base_drift, discard_staging, receive
from ._frame import Failure, _boot_id, _fault_point, _now, _write_json
from ._lease import _fence, _lock_path, _lock_state, _read_lock, _roll_back_steps, _settle, hold
from ._state import (_current_target, _disk_failure, _ensure_reserve, _ensure_root, _flip, _journal, _journal_quietly,
                     _load_state, _OpLock, _release, _save_state, _set_status)


# -- switch, mark, state -------------------------------------------------------------------------------------------------
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
            _ensure_reserve(root)  # what its verdict or its rollback will write, should the disk fill from here on
            _recheck_base(root, state, release_id, run_id)
            state["pending"] = {"release": release_id, "safe": previous, "run": run_id, "stage": "switched",
                                "since": _now(), "server_touched": False, "reason": reason}
            _set_status(state, release_id, "probing", "")
            _save_state(root, state)  # the intent is on disk before `current` moves
            _fault_point(root, "switch:pending")
        target = _flip(root, release_id)
        _fault_point(root, "switch:flipped")
        try:  # `current` has moved: state.json follows it
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
        except OSError as exc:
            raise _disk_failure(root, exc, "recording the switch to %s" % (release_id or "the installed package"),
                                switched=True) from None
    return {"from": previous, "to": release_id, "previous_good": state["previous_good"], "target": target}


def _recheck_base(root, state, release_id, run_id):
    """The last look at base drift, right before `current` moves: the installed files the release replaces are hashed
    again against the snapshot it was built from (only those, so it is cheap). A change since the build's own check
    (a hotfix landing while it ran) stops the switch, names the file, and removes the release, which would hide it."""
    try:
        with open(os.path.join(root, "releases", release_id, "RELEASE.json")) as fh:
            check = json.load(fh).get("switch_check")
    except (OSError, ValueError):
        check = None
    if not check:
        return
    drift = base_drift(check["site_packages"], check["package"], check["files"], check["base_hashes"])
    if not drift:
        return
    shutil.rmtree(os.path.join(root, "releases", release_id), ignore_errors=True)
    state["releases"] = [r for r in state["releases"] if r["id"] != release_id]
    _save_state(root, state)
    _journal_quietly(root, "drift", run=run_id, release=release_id, at="switch", files=drift[:20])
    snap = "snapshot %s" % check["base_snapshot"] if check.get("base_snapshot") else "its snapshot"
    raise Failure("the installed %s changed after release %s was built from %s (%d file(s) it replaces differ, "
                  "checked again right before the switch):\n  %s\nrelease %s was removed"
                  % (check["package"], release_id, snap, len(drift), "\n  ".join(drift[:8]), release_id), "drift")


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
                _write_json(_lock_path(root), rec)
        _fault_point(root, "server:" + action)
        res = _server.control(root, spec, action, release, ddtree)
        if rec is not None:
            state = _load_state(root)
            pend = state.get("pending")
            if pend and pend.get("run") == fence and action != "stop":
                pend["stage"] = "probing"
                _save_state(root, state)
        return res


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
        _fault_point(root, "finish:start")
        state = _load_state(root)
        try:
            if release_id and status:
                _set_status(state, release_id, status, note)
            pend = state.get("pending")
            if pend and (pend.get("run") == run_id or pend.get("release") == release_id):
                state["pending"] = None
            _save_state(root, state)
        except OSError as exc:
            raise _disk_failure(root, exc, "recording the verdict on %s" % (release_id or "the run"), switched=True) from None
        if release_id and status:
            _journal_quietly(root, "mark", run=run_id, release=release_id, status=status, note=note)
        removed = _cleanup(root, keep, run_id)
        entry = dict(fields)
        entry["run"] = run_id
        _journal_quietly(root, event, **entry)
    return {"removed": removed}


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
                lines = [json.loads(ln) for ln in fh.read().splitlines()[-journal_lines:] if ln.strip()]
        except OSError:
            lines = []
    return {"root": root, "state": state, "current": _current_target(root), "lock": lock_info,
            "lock_state": _lock_state(lock_info), "boot_id": _boot_id(), "journal": lines, "root_exists": os.path.isdir(root)}


def _protected(state):
    """Releases never removed: the active one, the rollback target and a pending one."""
    return {state["active"], state["previous_good"], (state.get("pending") or {}).get("release")}


def _drop(root, state, rel):
    """Remove one release's files and its records in ``state`` (the caller saves state and journals)."""
    shutil.rmtree(os.path.join(root, "releases", rel["id"]), ignore_errors=True)
    state["releases"].remove(rel)
    if rel["id"] in state["bad"]:
        state["bad"].remove(rel["id"])


def _cleanup(root, keep, run_id=None):
    state = _load_state(root)
    protected = _protected(state)
    ordered = list(state["releases"])
    removable = [r for r in ordered if r["id"] not in protected]
    excess = len(ordered) - keep
    removed = []
    for rel in removable:
        if excess <= 0:
            break
        _drop(root, state, rel)
        removed.append(rel["id"])
        excess -= 1
    if removed:
        _save_state(root, state)
        _journal(root, "cleanup", run=run_id, removed=removed)
    return removed


def discard_release(root, release_id, run_id, why, fence=None):
    """Remove a release this run pushed and never switched to (its launch line was refused before the switch), so
    the host is left as the run found it but for the journal line. Refused for any release another run pushed, and
    for the active one, the rollback target or a pending one."""
    with _OpLock(root):
        _fence(root, fence)
        state = _load_state(root)
        rel = next((r for r in state["releases"] if r["id"] == release_id), None)
        if rel is None:
            return {"removed": False, "why": "no such release"}
        if release_id in _protected(state) or rel.get("run") != run_id:
            raise Failure("release %s is in use or was not pushed by run %s: not removed" % (release_id, run_id),
                          "protected")
        _drop(root, state, rel)
        _save_state(root, state)
        _journal(root, "discard", run=run_id, release=release_id, why=why)
    return {"removed": True}


def cleanup(root, keep, run_id=None, fence=None):
    """Keep the newest ``keep`` releases; never remove the active one, the rollback target or a pending one."""
    with _OpLock(root):
        _fence(root, fence)
        return {"removed": _cleanup(root, keep, run_id)}


OPS = {
    "hold": hold, "receive": receive, "discard_staging": discard_staging, "switch": switch, "roll_back": roll_back,
    "reconcile": reconcile, "server_action": server_action, "mark": mark, "finish": finish,
    "show": show, "cleanup": cleanup, "discard_release": discard_release,
}
