# ruff: noqa: F821  (Failure, _json, _sys, _MODULES and the _-helpers come from _frame.py, glued in front of this program)
# requires: server probe
# includes: _state _lease
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
# Its parts: _state.py (state.json, journal, `current`, the step lock) and _lease.py (the lock, its guardian, the
# fence, settling a run that stopped early) are glued into this program (`# includes:` above).
#
# The transaction (docs/design.md, "The deploy transaction"): `pending` in state.json is written BEFORE `current`
# moves to a release that has not passed its probe, and names the release to go back to ("safe"). It is cleared only
# by the verdict (finish) or by a rollback that reached the safe release. The lock's holder process (`hold`, one per
# run, on the run's own SSH connection) sees the control side vanish (end of input, its sshd gone, or no heartbeat)
# and then settles any pending switch itself: back to the safe release, server restarted on it, lock released.
# Every step of a run passes `fence=<run id>` and is refused once that run no longer holds a live lock.
import errno
import os
import py_compile
import shutil
import subprocess
import time

_server = _MODULES["server"]
_probe = _MODULES["probe"]


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
        _write_json(os.path.join(partial, "RELEASE.json"), record, indent=1)
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


def receive(root, staging, **build_args):
    """A push in one round trip (HostConnection.call with a stream): the overlay's tar stream, which follows the
    request on our stdin, unpacked into ``staging``, then ``build`` from it. A stream that fails to unpack (cut,
    a full disk) leaves no staging dir and builds nothing."""
    _ensure_root(root)
    try:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        tar = subprocess.run(["tar", "-x", "-f", "-", "-C", staging, "--no-same-owner"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # stdin: ours, the rest of the stream
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _disk_failure(root, exc, "receiving the overlay") from None
    if tar.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        err = tar.stderr.decode("utf-8", "replace").strip()[-1500:]
        if "No space left" in err:
            raise Failure("no space left on the release root %s while receiving the overlay (%.1f MB free); "
                          "nothing was switched" % (root, _free_mb(root)), "disk")
        raise Failure("receiving the overlay into %s failed (tar exit %d: %s); nothing was switched"
                      % (staging, tar.returncode, err), "receive")
    return build(root=root, staging=staging, **build_args)


def discard_staging(path):
    shutil.rmtree(path, ignore_errors=True)
    return True


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


OPS = {
    "hold": hold, "receive": receive, "discard_staging": discard_staging, "switch": switch, "roll_back": roll_back,
    "reconcile": reconcile, "server_action": server_action, "mark": mark, "finish": finish,
    "show": show, "cleanup": cleanup,
}
