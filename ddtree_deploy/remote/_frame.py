"""What every op on a host runs with: the reply protocol (``main``) and the small helpers the remote modules share.

Stdlib only, and it must run on any Python >= 3.8 a host may use for SGLang.
"""
import errno
import hashlib
import importlib
import json
import os
import sys
import time
import traceback

#: What starts each reply line on stdout (the control side reads the JSON envelope after it: transport.base).
RESULT_MARKER = "@@DDTREE-RESULT@@"
# The process that started us: the host's per-connection sshd (or its shell). When it is gone, the control side's
# connection is gone too, and a step that has not yet committed must not commit on its own (see _control_lost).
_PPID0 = os.getppid()


class Failure(Exception):
    """An expected failure with a message for the user (not a crash)."""

    def __init__(self, message, kind="error"):
        Exception.__init__(self, message)
        self.kind = kind


def server_env(root, env):
    """The environment the server runs with: ours, the host file's `env`, and PYTHONPATH=<root>/current first.

    Shared by the server launcher and the probe, so the probe inspects exactly what the server imports.
    """
    full = dict(os.environ)
    full.update({k: str(v) for k, v in (env or {}).items()})
    current = os.path.join(root, "current")
    rest = full.get("PYTHONPATH", "")
    full["PYTHONPATH"] = current + (os.pathsep + rest if rest else "")
    return full


# -- helpers shared by the remote modules (one copy each) ----------------------------------------------------------
def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _write_atomic(path, data):
    """Write ``data`` (bytes) to ``path`` through a temporary file and a rename; on failure (a full disk) the
    temporary file is removed and the old ``path`` is left as it was."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_json(path, data, indent=None):
    """``data`` as JSON (keys sorted, a final newline) through ``_write_atomic``: how every remote module writes
    a JSON file (state, lock, release record, pid file, baseline, caches)."""
    _write_atomic(path, (json.dumps(data, indent=indent, sort_keys=True) + "\n").encode())


def _read_json(path):
    """A JSON file's content, or None when it is missing or unreadable (a cache: its absence only costs time)."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _write_cache(path, data):
    """Write a cache file (compact JSON, atomic); a cache we cannot write is only slower next time, never a
    failure: returns whether it was written."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_atomic(path, json.dumps(data, separators=(",", ":")).encode())
        return True
    except OSError:
        return False


def _stat_key(st):
    """What says a file is unchanged without reading it: size, mtime, inode and ctime (ctime cannot be set back)."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _proc_start_ticks(pid):
    """Start time of ``pid`` in clock ticks since boot, or None when it does not run (a zombie does not run)."""
    try:
        with open("/proc/%d/stat" % int(pid)) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError, ValueError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat


def _proc_alive(pid, ticks):
    """True while the process ``pid`` that started at ``ticks`` runs: a recycled pid is never mistaken for it."""
    return isinstance(pid, int) and ticks is not None and _proc_start_ticks(pid) == ticks


def _port_listener(port):
    """{pid, cmdline} of the process listening on TCP ``port`` (any address), {} when its owner is not visible,
    or None when nothing listens. Read from /proc, so it needs no tool on the host."""
    inodes = set()
    hexport = "%04X" % int(port)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and f[1].rsplit(":", 1)[1] == hexport:
                inodes.add("socket:[%s]" % f[9])
    if not inodes:
        return None
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes:
                    with open("/proc/%s/cmdline" % pid, "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
                    return {"pid": int(pid), "cmdline": cmd[:300]}
            except OSError:
                continue
    return {}


def _control_lost():
    """The control side's SSH session is gone (our parent changed: sshd died and we were re-parented)."""
    return os.getppid() != _PPID0


def _fault_point(root, name):
    """Fault-injection hook for the fault suite (bench/faults.py): when ``<root>/.fault-points`` lists ``name``,
    write ``<root>/.fault-reached`` and wait (at most 60 s) until the suite removes it. One stat otherwise."""
    ctl = os.path.join(root, ".fault-points")
    if not os.path.exists(ctl):
        return
    try:
        with open(ctl) as fh:
            points = json.load(fh)
    except (OSError, ValueError):
        return
    if name not in points:
        return
    reached = os.path.join(root, ".fault-reached")
    with open(reached, "w") as fh:
        fh.write(name)
    deadline = time.time() + 60
    while os.path.exists(reached) and time.time() < deadline:
        time.sleep(0.01)


def _disk_message(exc):
    where = getattr(exc, "filename", None) or "the host"
    if exc.errno == errno.EDQUOT:
        return "disk quota exceeded writing %s" % where
    return "no space left on the device holding %s" % where


def _emit(reply):
    """One reply line (a session op sends several: see transport.RemoteSession); a closed pipe is ignored."""
    try:
        sys.stdout.write("\n" + RESULT_MARKER + json.dumps(reply) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def main(payload):
    """Run one request (``{module, op, args}`` as JSON bytes, read from fd 0 by the boot line) and emit its reply:
    ``{ok, result}``, or ``{ok: false, error, kind}`` for a Failure (its kind), a full disk ("disk") or anything
    else ("crash", with the traceback). The op's module is imported here, so an import that fails is a reply too."""
    try:
        request = json.loads(payload.decode())
        module, op = request["module"], request["op"]
        if module.startswith("_") or "." in module:
            raise Failure("no remote module %r" % module, "usage")
        try:
            ops = importlib.import_module("." + module, __package__).OPS
        except ModuleNotFoundError as exc:
            if exc.name != "%s.%s" % (__package__, module):
                raise  # something the module imports is missing on this host: a crash, with its traceback
            raise Failure("no remote module %r" % module, "usage") from None
        if op not in ops:
            raise Failure("unknown op %r (have: %s)" % (op, ", ".join(sorted(ops))), "usage")
        reply = {"ok": True, "result": ops[op](**request["args"])}
    except Failure as exc:
        reply = {"ok": False, "error": str(exc), "kind": exc.kind}
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            reply = {"ok": False, "error": _disk_message(exc), "kind": "disk"}
        else:
            reply = {"ok": False, "error": traceback.format_exc(), "kind": "crash"}
    except Exception:
        reply = {"ok": False, "error": traceback.format_exc(), "kind": "crash"}
    _emit(reply)
