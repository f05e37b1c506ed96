# Server lifecycle on the host: a managed process (setsid, pid file, log under the release root) or a systemd
# unit with a drop-in. Stdlib only. The pid file records the process start time too, so a recycled pid is never
# mistaken for our server and never signalled.
#
# `control(root, spec, action, release, ddtree)` is the one entry the deploy transaction uses (release.py calls it
# under the host lock, and so does its guardian when it rolls a host back on its own); `spec` is what the host file
# says about the server (kind, both launch commands, env, unit, drop-ins, become), built by server.server_spec().
import os
import shlex
import signal
import subprocess
import time

from ._frame import (Failure, _now, _port_listener, _proc_alive, _proc_start_ticks, _read_json, _write_atomic,
                     _write_json, server_env)


def _paths(root):
    d = os.path.join(root, "server")
    return d, os.path.join(d, "server.pid"), os.path.join(d, "server.log")


def _read_pid(pid_file):
    """The pid record ({pid, start_ticks, ...}), or None when there is none: read like every remote JSON file."""
    return _read_json(pid_file)


def _alive(record):
    return bool(record) and _proc_alive(record.get("pid"), record.get("start_ticks"))


def _tail(path, lines, offset=0):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            start = max(offset, size - 64 * 1024)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def foreign_listener(port, wait=0.0):
    """The process holding ``port``, described for a message; None when the port is free. ``wait``: give a port
    that is being let go (a server we just stopped, still closing its socket) that long to become free."""
    deadline = time.time() + wait
    while True:
        owner = _port_listener(port)
        if owner is None:
            return None
        if time.time() >= deadline:
            break
        time.sleep(0.05)
    if owner.get("pid"):
        return "pid %d (%s)" % (owner["pid"], owner.get("cmdline") or "?")
    return "a process this user cannot see"


def start(root, command, env, release=None, port=None):
    """Start ``command`` in its own session with the server environment; stdout+stderr go to the log.

    Refuses when our server already runs, and when another process (one we did not start) already listens on
    ``port``: the new server would die on "Address already in use" while the old one kept answering /health."""
    d, pid_file, log_file = _paths(root)
    os.makedirs(d, exist_ok=True)
    record = _read_pid(pid_file)
    if _alive(record):
        raise Failure("server already running (pid %d, started %s); stop it first" % (record["pid"], record.get("started")),
                      "running")
    if port:
        other = foreign_listener(port, wait=3.0)
        if other:
            raise Failure("port %s is already in use by %s, a server ddtree-deploy did not start (no live pid file in "
                          "%s); stop it (or change server.port) before starting the server" % (port, other, d), "port-in-use")
    if os.path.exists(log_file):
        os.replace(log_file, log_file + ".1")  # the probe reads only this run's log
    log = open(log_file, "ab")
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", "exec " + command], cwd=d, env=server_env(root, env),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        raise Failure("cannot start the server: %s" % exc, "start") from None
    finally:
        log.close()
    ticks = None
    for _ in range(50):
        ticks = _proc_start_ticks(proc.pid)
        if ticks is not None:
            break
        time.sleep(0.002)
    record = {"pid": proc.pid, "start_ticks": ticks, "release": release, "command": command,
              "started": _now(), "started_epoch": time.time()}
    _write_json(pid_file, record)
    return {"pid": proc.pid, "log": log_file, "pid_file": pid_file, "start_ticks": ticks}


def stop(root, wait=20.0):
    """SIGTERM the server's process group, wait up to ``wait`` seconds, then SIGKILL it."""
    timeout = wait
    d, pid_file, log_file = _paths(root)
    record = _read_pid(pid_file)
    if not _alive(record):
        if os.path.exists(pid_file):
            os.unlink(pid_file)
        return {"was_running": False}
    pid = record["pid"]
    t0 = time.time()
    sig_used = "TERM"
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while time.time() - t0 < timeout and _alive(record):
        time.sleep(0.05)
    if _alive(record):
        sig_used = "KILL"
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while time.time() - t0 < timeout + 5 and _alive(record):
            time.sleep(0.05)
    if os.path.exists(pid_file):
        os.unlink(pid_file)
    return {"was_running": True, "pid": pid, "signal": sig_used, "seconds": round(time.time() - t0, 3)}


def restart(root, command, env, release=None, wait=20.0, port=None):
    """stop + start in one round trip."""
    stopped = stop(root, wait)
    started = start(root, command, env, release, port)
    return {"stopped": stopped, "started": started}


def status(root, lines=0, port=None):
    d, pid_file, log_file = _paths(root)
    record = _read_pid(pid_file)
    alive = _alive(record)
    out = {"running": alive, "pid": record.get("pid") if record else None, "release": record.get("release") if record else None,
           "started": record.get("started") if record else None, "log": log_file, "pid_file": pid_file,
           "uptime": round(time.time() - record["started_epoch"], 1) if alive and record.get("started_epoch") else None}
    if port and not alive:
        out["foreign"] = foreign_listener(port)
    if lines:
        out["log_tail"] = _tail(log_file, lines)
    return out


def logs(root, lines=100, previous=False):
    d, pid_file, log_file = _paths(root)
    return {"log": log_file + (".1" if previous else ""), "text": _tail(log_file + (".1" if previous else ""), lines)}


# -- systemd ---------------------------------------------------------------------------------------------------------------
def _become(become):
    """The privilege-escalation prefix the host file asks for ("" for none): a list of argv words."""
    return shlex.split(become) if become else []


def _run(argv, become="", data=None):
    """Run ``argv`` (with the become prefix); (exit code, output). A become that cannot run is a clear Failure."""
    full = _become(become) + list(argv)
    try:
        proc = subprocess.run(full, input=data, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        raise Failure("cannot run %s: %s" % (full[0], exc.strerror or exc), "systemd") from None
    text = proc.stdout.decode("utf-8", "replace")
    if become and proc.returncode != 0 and ("password is required" in text or "a terminal is required" in text
                                            or "not allowed" in text or "not in the sudoers" in text):
        raise Failure("`%s %s` was refused: %s (server.become needs passwordless rights for systemctl, journalctl "
                      "and writing the drop-in)" % (become, " ".join(argv[:2]), text.strip()[-300:]), "become")
    return proc.returncode, text


def _systemctl(*args, become=""):
    return _run(["systemctl"] + list(args), become)


def systemd_dropin(unit, content, unit_dir="/etc/systemd/system", reload=True, become=""):
    """Write ``<unit>.d/50-ddtree.conf`` atomically (only if it changed), then `systemctl daemon-reload`.
    With ``become`` the write runs through it too (the drop-in directory is root's)."""
    d = os.path.join(unit_dir, unit + ".d")
    path = os.path.join(d, "50-ddtree.conf")
    try:
        with open(path) as fh:
            if fh.read() == content:
                return {"path": path, "changed": False}
    except OSError:
        pass
    if become:
        script = 'mkdir -p "$1" && cat > "$2.tmp" && mv -f "$2.tmp" "$2"'
        code, out = _run(["sh", "-c", script, "sh", d, path], become, data=content.encode())
        if code != 0:
            raise Failure("writing %s through `%s` failed (%d): %s" % (path, become, code, out.strip()[-500:]), "systemd")
    else:
        try:
            os.makedirs(d, exist_ok=True)
            _write_atomic(path, content.encode())
        except PermissionError:
            raise Failure("cannot write %s as %s: permission denied (set server.become: sudo in the host file)"
                          % (path, os.environ.get("USER", "this user")), "become") from None
    if reload:
        code, out = _systemctl("daemon-reload", become=become)
        if code != 0:
            raise Failure("systemctl daemon-reload failed: %s" % out.strip(), "systemd")
    return {"path": path, "changed": True}


def systemd(unit, action, timeout=60.0, become=""):
    if action not in ("start", "stop", "restart"):
        raise Failure("unknown systemd action %r" % action, "usage")
    code, out = _systemctl(action, unit, become=become)
    if code != 0:
        raise Failure("systemctl %s %s failed (%d): %s" % (action, unit, code, out.strip()[-2000:]), "systemd")
    return {"unit": unit, "action": action}


def systemd_status(unit, lines=0, become=""):
    code, out = _systemctl("show", unit, "-p", "MainPID", "-p", "ActiveState", "-p", "SubState",
                           "-p", "ExecMainStartTimestamp", "-p", "ExecMainStatus", become=become)
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    pid = int(props.get("MainPID") or 0)
    res = {"running": props.get("ActiveState") == "active" and pid > 0, "pid": pid or None, "unit": unit,
           "state": "%s/%s" % (props.get("ActiveState"), props.get("SubState")), "started": props.get("ExecMainStartTimestamp")}
    if lines:
        res["log_tail"] = systemd_logs(unit, lines, become)["text"]
    return res


def systemd_logs(unit, lines=100, become=""):
    code, out = _run(["journalctl", "-u", unit, "-n", str(int(lines)), "--no-pager", "-o", "cat"], become)
    return {"log": "journalctl -u %s" % unit, "text": out}


# -- the one entry of the deploy transaction --------------------------------------------------------------------------------
def _launch_path(root):
    return os.path.join(_paths(root)[0], "launch.json")


def _record_launch(root, spec, line, release, ddtree):
    """What the server was last started with (the managed command line, or the systemd drop-in), so a later
    apply / probe / releases can tell when the host file asks for other flags than the running server has."""
    os.makedirs(_paths(root)[0], exist_ok=True)
    _write_json(_launch_path(root), {"kind": spec.get("kind"), "launch": line, "ddtree": bool(ddtree),
                                     "env": spec.get("env") or {}, "release": release, "started": _now()})


def launch(root):
    """Op: the launch record of the server (None when it was never started by this tool, or it is stopped). A
    managed server started before launch records existed: the command its pid file names."""
    record = _read_json(_launch_path(root))
    if record is None:
        pid = _read_pid(_paths(root)[1])
        if _alive(pid) and pid.get("command"):
            record = {"kind": "managed", "launch": pid["command"], "release": pid.get("release")}
    return record


def control(root, spec, action, release=None, ddtree=True):
    """``action`` (start | stop | restart) on the host's server as ``spec`` says, on ``release`` with DDTree flags
    on or off. Managed: our own process; systemd: the drop-in for that mode (rewritten only when it changes), then
    systemctl. A start or restart records its launch line (``launch``); a stop removes the record."""
    if action == "stop" and os.path.exists(_launch_path(root)):
        os.unlink(_launch_path(root))
    if spec.get("kind") == "systemd":
        if action != "stop":
            line = spec["dropin_on" if ddtree else "dropin_off"]
            systemd_dropin(spec["unit"], line, spec.get("unit_dir") or "/etc/systemd/system", become=spec.get("become", ""))
            res = systemd(spec["unit"], action, become=spec.get("become", ""))
            _record_launch(root, spec, line, release, ddtree)
            return res
        return systemd(spec["unit"], action, become=spec.get("become", ""))
    wait = float(spec.get("stop_timeout", 20.0))
    command = spec["command_on" if ddtree else "command_off"]
    if action == "stop":
        return stop(root, wait)
    if action == "start":
        res = start(root, command, spec.get("env") or {}, release, spec.get("port"))
    else:
        res = restart(root, command, spec.get("env") or {}, release, wait, spec.get("port"))
    _record_launch(root, spec, command, release, ddtree)
    return res


def running(root, spec):
    """Whether the host's server runs (managed: our pid file's process; systemd: the unit)."""
    if spec.get("kind") == "systemd":
        return systemd_status(spec["unit"], become=spec.get("become", ""))["running"]
    return _alive(_read_pid(_paths(root)[1]))


OPS = {"start": start, "stop": stop, "restart": restart, "status": status, "logs": logs, "systemd_dropin": systemd_dropin,
       "systemd": systemd, "systemd_status": systemd_status, "systemd_logs": systemd_logs, "control": control,
       "launch": launch}
