"""Building a release from the overlay a push streams in (receive -> build), the base-drift check, and the staging
dir: a part of the release ops (release.py). Stdlib only."""
import errno
import os
import py_compile
import shutil
import subprocess
import sys
import time

from ._frame import Failure, _control_lost, _fault_point, _now, _sha256_file, _write_json
from ._lease import _fence
from ._state import _OpLock, _disk_failure, _ensure_root, _free_mb, _journal, _load_state, _save_state


# -- build -----------------------------------------------------------------------------------------------------------
def _link_tree(src, dst, mode="hardlink"):
    """Copy ``src`` to ``dst`` as hard links (``mode`` "hardlink"), falling back to real copies across devices;
    returns the mode it ended in ("copy" once a hard link was refused)."""
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
            if mode == "hardlink":
                try:
                    os.link(s, d)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
                    mode = "copy"
            shutil.copy2(s, d)
    return mode


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
    mode = "hardlink"
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
        mode = _link_tree(installed, os.path.join(partial, package), mode)
        dist_infos = []
        for entry in sorted(os.listdir(site_packages)):
            if entry.endswith(".dist-info") and entry.startswith(package + "-"):
                mode = _link_tree(os.path.join(site_packages, entry), os.path.join(partial, entry), mode)
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
                              % (rel, sys.executable, exc.msg.strip().splitlines()[-1]), "syntax") from None
        record = dict(meta)
        record.update({
            "id": release_id, "created": _now(), "package": package, "installed_from": installed,
            "link_mode": mode, "dist_info": dist_infos, "purged_pycache": purged,
            "compiled_by": sys.executable, "python": "%d.%d.%d" % sys.version_info[:3], "base_drift": drift,
        })
        if base_hashes is not None and not allow_base_drift:  # what the switch hashes again right before it moves
            record["switch_check"] = {
                "site_packages": site_packages, "package": package, "base_snapshot": meta.get("base_snapshot"),
                "files": [{"path": f["path"], "action": f["action"]} for f in files if f["action"] in ("replace", "add")],
                "base_hashes": {f["path"]: base_hashes[f["path"]] for f in files if f["path"] in base_hashes}}
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
                     digest=meta.get("overlay_digest"), link_mode=mode, abi_ignored=meta.get("abi_ignored"),
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
    return {"id": release_id, "path": final, "link_mode": mode, "seconds": round(time.time() - started, 3),
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
