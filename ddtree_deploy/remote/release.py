# ruff: noqa: F821  (Failure, _json and _sys come from _frame.py, which is glued in front of this program)
# Release operations on the host: build a release from a staged overlay, switch `current`, keep state, lock.
# Stdlib only; runs under the host's own Python (the one SGLang runs under), so byte-compiling here uses the
# exact interpreter and magic number the server will use.
#
# Layout under the release root:
#   releases/<id>/sglang/...        hard-link copy of the installed package, overlay files written by REPLACING links
#   releases/<id>/sglang-*.dist-info hard-link copy, so importlib.metadata still answers from the release
#   releases/<id>/RELEASE.json      patch set, versions, base snapshot, overlay hashes
#   base/                           empty directory: what `current` points at when no overlay is active
#   current -> releases/<id> | base switched atomically (symlink to a temp name, then rename over `current`)
#   state.json                      releases, active, previous_good, bad (rewritten atomically)
#   journal.log                     append-only, one JSON object per line
#   lock                            per-host deploy lock (created with O_EXCL)
#   staging/<run>/                  where the overlay tar stream lands before `build`
import errno
import hashlib
import os
import py_compile
import shutil
import socket
import stat
import time

STATE_VERSION = 1


# -- small helpers ---------------------------------------------------------------------------------------------------
def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _write_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def _release(state, rid):
    for rel in state["releases"]:
        if rel["id"] == rid:
            return rel
    return None


def _current_target(root):
    try:
        target = os.readlink(os.path.join(root, "current"))
    except OSError:
        return None
    return target


def _ensure_root(root):
    try:
        os.makedirs(os.path.join(root, "releases"), exist_ok=True)
        os.makedirs(os.path.join(root, "base"), exist_ok=True)
    except OSError as exc:
        raise Failure("cannot create release root %s: %s" % (root, exc.strerror), "root") from None


def _disk_failure(root, exc, what):
    if exc.errno == errno.ENOSPC:
        st = os.statvfs(root)
        free = st.f_bavail * st.f_frsize
        return Failure("no space left on the release root %s while %s (%.1f MB free); nothing was switched"
                       % (root, what, free / 1e6), "disk")
    if exc.errno == errno.EDQUOT:
        return Failure("disk quota exceeded on %s while %s; nothing was switched" % (root, what), "disk")
    return Failure("%s failed on %s: %s (%s); nothing was switched"
                   % (what, root, exc.strerror or exc, getattr(exc, "filename", "")), "io")


def _has_baseline(root):
    # the probe's generation baseline lives in the release root (probe.py: baseline_path); reported with the lock
    # so a deploy learns whether it must record one without another round trip
    return os.path.isfile(os.path.join(root, "probe-baseline.json"))


# -- lock ----------------------------------------------------------------------------------------------------------------
def lock(root, owner, break_lock=False):
    """Take the per-host deploy lock, or report who holds it. ``owner`` describes the run (id, user, control host)."""
    _ensure_root(root)
    path = os.path.join(root, "lock")
    record = dict(owner)
    record.update({"taken": _now(), "host_boot_id": _boot_id()})
    data = (_json.dumps(record, sort_keys=True) + "\n").encode()
    broken = None
    if break_lock:
        try:
            with open(path) as fh:
                broken = _json.load(fh)
        except (OSError, ValueError):
            broken = None
        _write_atomic(path, data)
        _journal(root, "lock-broken", run=owner.get("run_id"), previous=broken)
        return {"acquired": True, "broken": broken, "state": _load_state(root), "has_baseline": _has_baseline(root)}
    # write the record under a private name, then hard-link it to `lock`: link() fails if `lock` exists, so taking
    # the lock and its content appear at once (a rival never reads a half-written lock)
    tmp = "%s.%d.%s" % (path, os.getpid(), owner.get("run_id", ""))
    with open(tmp, "wb") as fh:
        fh.write(data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        os.unlink(tmp)
        try:
            with open(path) as fh:
                holder = _json.load(fh)
        except (OSError, ValueError):
            holder = {"unreadable": True}
        rebooted = bool(holder.get("host_boot_id")) and holder.get("host_boot_id") != _boot_id()
        return {"acquired": False, "holder": holder, "host_rebooted": rebooted}
    os.unlink(tmp)
    return {"acquired": True, "broken": None, "state": _load_state(root), "has_baseline": _has_baseline(root)}


def unlock(root, run_id):
    """Release the lock only if ``run_id`` holds it (a second run must never remove the first run's lock)."""
    path = os.path.join(root, "lock")
    try:
        with open(path) as fh:
            holder = _json.load(fh)
    except FileNotFoundError:
        return {"released": False, "reason": "no lock"}
    except ValueError:
        return {"released": False, "reason": "unreadable lock"}
    if holder.get("run_id") != run_id:
        return {"released": False, "reason": "held by %s" % holder.get("run_id")}
    os.unlink(path)
    return {"released": True}


# -- build -----------------------------------------------------------------------------------------------------------
def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def build(root, site_packages, package, release_id, staging, files, meta, keep=5, and_switch=False):
    """Make ``releases/<release_id>`` from the installed package plus the staged overlay files; never switch.

    ``files``: [{path, sha256, mode, action}] relative to site-packages. Every staged file is verified against
    its hash first (a cut or corrupted transfer fails here); a syntax error in a changed .py fails the build.
    On any failure the partial release and the staging dir are removed and state.json is untouched.
    """
    _ensure_root(root)
    installed = os.path.join(site_packages, package)
    if not os.path.isdir(installed):
        raise Failure("installed package not found: %s" % installed, "missing")
    final = os.path.join(root, "releases", release_id)
    if os.path.exists(final):
        raise Failure("release %s already exists on the host" % release_id, "exists")
    partial = os.path.join(root, "releases", ".partial-" + release_id)
    started = time.time()
    _clean_stale(root, keep=os.path.basename(staging.rstrip("/")))
    mode = ["hardlink"]
    try:
        for f in files:
            staged = os.path.join(staging, f["path"])
            if not os.path.isfile(staged):
                raise Failure("staged overlay file missing: %s (transfer incomplete?)" % f["path"], "transfer")
            got = _sha256(staged)
            if got != f["sha256"]:
                raise Failure("staged overlay file %s has sha256 %s, expected %s (transfer corrupted)"
                              % (f["path"], got[:12], f["sha256"][:12]), "transfer")
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
            "compiled_by": _sys.executable, "python": "%d.%d.%d" % _sys.version_info[:3],
        })
        _write_atomic(os.path.join(partial, "RELEASE.json"), (_json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        os.rename(partial, final)
    except Failure:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise _disk_failure(root, exc, "building release %s" % release_id) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    state = _load_state(root)
    state["releases"].append({"id": release_id, "created": record["created"], "status": "pushed",
                              "patchset": meta.get("patchset"), "patchset_version": meta.get("patchset_version"),
                              "base_version": meta.get("base_version"), "overlay_digest": meta.get("overlay_digest")})
    _save_state(root, state)
    _journal(root, "push", release=release_id, run=meta.get("run_id"), by=meta.get("pushed_by"),
             patchset=meta.get("patchset"), patchset_version=meta.get("patchset_version"),
             base_version=meta.get("base_version"), base_snapshot=meta.get("base_snapshot"),
             digest=meta.get("overlay_digest"), link_mode=mode[0], abi_ignored=meta.get("abi_ignored"))
    switched = None
    if and_switch:  # the caller's next step, done in this same round trip: the build above already succeeded
        switched = switch(root, release_id, run_id=meta.get("run_id"), reason="deploy")
    return {"id": release_id, "path": final, "link_mode": mode[0], "seconds": round(time.time() - started, 3),
            "files": len(files), "purged_pycache": purged, "switch": switched}


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
def switch(root, release_id, run_id=None, reason="deploy", mark_bad=None, note=""):
    """Point ``current`` at ``releases/<release_id>`` (or at the empty ``base`` dir for None) atomically.
    ``mark_bad``: a release to mark bad in the same step (the one a rollback leaves)."""
    _ensure_root(root)
    if mark_bad:
        mark(root, mark_bad, "bad", run_id, note)
    state = _load_state(root)
    if release_id is not None:
        rel = _release(state, release_id)
        if rel is None or not os.path.isdir(os.path.join(root, "releases", release_id)):
            raise Failure("no release %s on this host (have: %s)"
                          % (release_id, ", ".join(r["id"] for r in state["releases"]) or "none"), "missing")
        target = os.path.join("releases", release_id)
    else:
        target = "base"
    previous = state["active"]
    prev_rel = _release(state, previous) if previous else None
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
    if previous != release_id:
        # "previous good" is what we go back to when this release fails its probe: the release we leave if it
        # was good (or the installed package), else whatever was previous good before it.
        if previous is None or (prev_rel is not None and prev_rel.get("status") == "good"):
            state["previous_good"] = previous
    state["active"] = release_id
    _save_state(root, state)
    _journal(root, "switch", run=run_id, reason=reason, **{"from": previous, "to": release_id})
    return {"from": previous, "to": release_id, "previous_good": state["previous_good"], "target": target}


def mark(root, release_id, status, run_id=None, note=""):
    """Record a probe verdict: status "good" or "bad" (bad releases are never chosen as rollback targets)."""
    state = _load_state(root)
    rel = _release(state, release_id)
    if rel is None:
        raise Failure("no release %s on this host" % release_id, "missing")
    rel["status"] = status
    if note:
        rel["note"] = note
    if status == "bad" and release_id not in state["bad"]:
        state["bad"].append(release_id)
    if status == "good" and release_id in state["bad"]:
        state["bad"].remove(release_id)
    _save_state(root, state)
    _journal(root, "mark", run=run_id, release=release_id, status=status, note=note)
    return rel


def finish(root, release_id, status, keep, run_id, event, fields, note="", release_lock=False):
    """End of a run in one round trip: record the verdict on ``release_id`` (if any), prune old releases, journal,
    and (with ``release_lock``) give up the lock if this run holds it."""
    if release_id and status:
        mark(root, release_id, status, run_id, note)
    removed = cleanup(root, keep, run_id)["removed"]
    entry = dict(fields)
    entry["run"] = run_id
    _journal(root, event, **entry)
    unlocked = unlock(root, run_id) if release_lock else None
    return {"removed": removed, "unlocked": unlocked}


def journal(root, event, fields):
    _ensure_root(root)
    _journal(root, event, **fields)
    return True


def show(root, journal_lines=0):
    """State, the `current` link, the lock and (optionally) the journal tail."""
    state = _load_state(root)
    lock_info = None
    try:
        with open(os.path.join(root, "lock")) as fh:
            lock_info = _json.load(fh)
    except (OSError, ValueError):
        lock_info = None
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
            "boot_id": _boot_id(), "journal": lines, "root_exists": os.path.isdir(root)}


def read_release(root, release_id):
    with open(os.path.join(root, "releases", release_id, "RELEASE.json")) as fh:
        return _json.load(fh)


def cleanup(root, keep, run_id=None):
    """Keep the newest ``keep`` releases; never remove the active one or the rollback target."""
    state = _load_state(root)
    protected = {state["active"], state["previous_good"]}
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
    return {"removed": removed}


def package_manifest(site_packages, package):
    """sha256, size and mode of every file of the installed package: proves it is never modified."""
    base = os.path.join(site_packages, package)
    out = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, site_packages)] = [_sha256(path) if stat.S_ISREG(st.st_mode) else "link",
                                                        st.st_size, st.st_mode, int(st.st_mtime)]
    return out


OPS = {
    "lock": lock, "unlock": unlock, "build": build, "discard_staging": discard_staging,
    "switch": switch, "mark": mark, "finish": finish, "journal": journal, "show": show, "read_release": read_release,
    "cleanup": cleanup, "package_manifest": package_manifest,
}
