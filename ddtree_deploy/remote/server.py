# ruff: noqa: F821  (Failure, _json and _sys come from _frame.py, which is glued in front of this program)
# Server lifecycle on the host: a managed process (setsid, pid file, log under the release root) or a systemd
# unit with a drop-in. Stdlib only. The pid file records the process start time too, so a recycled pid is never
# mistaken for our server and never signalled.
import os
import signal
import subprocess
import time


def _paths(root):
    d = os.path.join(root, "server")
    return d, os.path.join(d, "server.pid"), os.path.join(d, "server.log")


def _start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat: start time in clock ticks since boot


def _read_pid(pid_file):
    try:
        with open(pid_file) as fh:
            return _json.load(fh)
    except (OSError, ValueError):
        return None


def _alive(record):
    if not record or not isinstance(record.get("pid"), int):
        return False
    ticks = _start_ticks(record["pid"])
    return ticks is not None and ticks == record.get("start_ticks")


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


def start(root, command, env, release=None):
    """Start ``command`` in its own session with the server environment; stdout+stderr go to the log."""
    d, pid_file, log_file = _paths(root)
    os.makedirs(d, exist_ok=True)
    record = _read_pid(pid_file)
    if _alive(record):
        raise Failure("server already running (pid %d, started %s); stop it first" % (record["pid"], record.get("started")),
                      "running")
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
        ticks = _start_ticks(proc.pid)
        if ticks is not None:
            break
        time.sleep(0.002)
    record = {"pid": proc.pid, "start_ticks": ticks, "release": release, "command": command,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "started_epoch": time.time()}
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(_json.dumps(record))
    os.replace(tmp, pid_file)
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


def restart(root, command, env, release=None, wait=20.0):
    """stop + start in one round trip."""
    stopped = stop(root, wait)
    started = start(root, command, env, release)
    return {"stopped": stopped, "started": started}


def status(root, lines=0):
    d, pid_file, log_file = _paths(root)
    record = _read_pid(pid_file)
    alive = _alive(record)
    out = {"running": alive, "pid": record.get("pid") if record else None, "release": record.get("release") if record else None,
           "started": record.get("started") if record else None, "log": log_file, "pid_file": pid_file,
           "uptime": round(time.time() - record["started_epoch"], 1) if alive and record.get("started_epoch") else None}
    if lines:
        out["log_tail"] = _tail(log_file, lines)
    return out


def logs(root, lines=100, previous=False):
    d, pid_file, log_file = _paths(root)
    return {"log": log_file + (".1" if previous else ""), "text": _tail(log_file + (".1" if previous else ""), lines)}


# -- systemd ---------------------------------------------------------------------------------------------------------------
def _systemctl(*args):
    proc = subprocess.run(["systemctl"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def systemd_dropin(unit, content, unit_dir="/etc/systemd/system", reload=True):
    """Write ``<unit>.d/50-ddtree.conf`` atomically (only if it changed), then `systemctl daemon-reload`."""
    d = os.path.join(unit_dir, unit + ".d")
    path = os.path.join(d, "50-ddtree.conf")
    try:
        with open(path) as fh:
            if fh.read() == content:
                return {"path": path, "changed": False}
    except OSError:
        pass
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(content)
    os.replace(tmp, path)
    if reload:
        code, out = _systemctl("daemon-reload")
        if code != 0:
            raise Failure("systemctl daemon-reload failed: %s" % out.strip(), "systemd")
    return {"path": path, "changed": True}


def systemd(unit, action, timeout=60.0):
    if action not in ("start", "stop", "restart"):
        raise Failure("unknown systemd action %r" % action, "usage")
    code, out = _systemctl(action, unit)
    if code != 0:
        raise Failure("systemctl %s %s failed (%d): %s" % (action, unit, code, out.strip()[-2000:]), "systemd")
    return {"unit": unit, "action": action}


def systemd_status(unit, lines=0):
    code, out = _systemctl("show", unit, "-p", "MainPID", "-p", "ActiveState", "-p", "SubState",
                           "-p", "ExecMainStartTimestamp", "-p", "ExecMainStatus")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    pid = int(props.get("MainPID") or 0)
    res = {"running": props.get("ActiveState") == "active" and pid > 0, "pid": pid or None, "unit": unit,
           "state": "%s/%s" % (props.get("ActiveState"), props.get("SubState")), "started": props.get("ExecMainStartTimestamp")}
    if lines:
        res["log_tail"] = systemd_logs(unit, lines)["text"]
    return res


def systemd_logs(unit, lines=100):
    proc = subprocess.run(["journalctl", "-u", unit, "-n", str(int(lines)), "--no-pager", "-o", "cat"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return {"log": "journalctl -u %s" % unit, "text": proc.stdout.decode("utf-8", "replace")}


OPS = {"start": start, "stop": stop, "restart": restart, "status": status, "logs": logs, "systemd_dropin": systemd_dropin,
       "systemd": systemd, "systemd_status": systemd_status, "systemd_logs": systemd_logs}
