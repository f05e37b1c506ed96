"""A small stand-in for systemd's ``systemctl`` and ``journalctl`` and for ``sudo``, for the systemd tests on sandbox
hosts (which run no systemd). Stdlib only; installed on a host as ``<dir>/bin/{systemctl,journalctl,sudo}``.

- ``sudo [-n] CMD...``: appends its argv to ``<dir>/sudo.log``, then runs CMD with ``<dir>/bin`` first on PATH;
  with ``<dir>/sudo-refuse`` present it prints sudo's "a password is required" and exits 1, like ``sudo -n`` for a
  user without passwordless rights.
- ``systemctl daemon-reload | start | stop | restart | show UNIT``: the unit is ``<unit_dir>/UNIT`` plus its drop-ins
  ``<unit_dir>/UNIT.d/*.conf`` (``Environment=`` and ``ExecStart=`` lines, the way systemd merges them), where
  ``<unit_dir>`` is read from ``<dir>/unit_dir``; the main process runs in its own session, its output goes to
  ``<dir>/UNIT.log``. ``show`` answers MainPID, ActiveState, SubState, ExecMainStartTimestamp, ExecMainStatus.
- ``journalctl -u UNIT [-n N] [--since ...]``: the unit's log.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.realpath(sys.argv[0])))  # <dir>


def _unit_dir():
    with open(os.path.join(HERE, "unit_dir")) as fh:
        return fh.read().strip()


def _config(unit):
    """(environment, ExecStart) merged from the unit file and its drop-ins in name order."""
    env, exec_start = {}, None
    files = [os.path.join(_unit_dir(), unit)]
    ddir = os.path.join(_unit_dir(), unit + ".d")
    if os.path.isdir(ddir):
        files += [os.path.join(ddir, n) for n in sorted(os.listdir(ddir)) if n.endswith(".conf")]
    for path in files:
        if not os.path.isfile(path):
            continue
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line.startswith("Environment="):
                    for word in shlex.split(line[len("Environment="):]):
                        k, _, v = word.partition("=")
                        env[k] = v
                elif line.startswith("ExecStart="):
                    exec_start = line[len("ExecStart="):].replace("%%", "%") or None
    return env, exec_start


def _pid_file(unit):
    return os.path.join(HERE, unit + ".pid")


def _running(unit):
    try:
        with open(_pid_file(unit)) as fh:
            rec = json.load(fh)
        with open("/proc/%d/stat" % rec["pid"]) as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return None
        return rec
    except (OSError, ValueError, KeyError):
        return None


def start(unit):
    if _running(unit):
        return 0
    env, cmd = _config(unit)
    if not cmd:
        print("Failed to start %s: Unit %s has no ExecStart." % (unit, unit), file=sys.stderr)
        return 5
    full = dict(os.environ, **env)
    log = open(os.path.join(HERE, unit + ".log"), "ab")
    proc = subprocess.Popen(["/bin/sh", "-c", "exec " + cmd], env=full, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
    with open(_pid_file(unit), "w") as fh:
        json.dump({"pid": proc.pid, "started": time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime())}, fh)
    return 0


def stop(unit):
    rec = _running(unit)
    if rec:
        try:
            os.killpg(rec["pid"], signal.SIGTERM)
        except OSError:
            pass
        deadline = time.time() + 10
        while _running(unit) and time.time() < deadline:
            time.sleep(0.05)
        if _running(unit):
            os.killpg(rec["pid"], signal.SIGKILL)
    try:
        os.unlink(_pid_file(unit))
    except OSError:
        pass
    return 0


def show(unit):
    rec = _running(unit)
    print("MainPID=%d" % (rec["pid"] if rec else 0))
    print("ActiveState=%s" % ("active" if rec else "inactive"))
    print("SubState=%s" % ("running" if rec else "dead"))
    print("ExecMainStartTimestamp=%s" % (rec["started"] if rec else ""))
    print("ExecMainStatus=0")
    return 0


def systemctl(args):
    if args[:1] == ["daemon-reload"]:
        return 0
    action, unit = args[0], args[1]
    if action == "start":
        return start(unit)
    if action == "stop":
        return stop(unit)
    if action == "restart":
        stop(unit)
        return start(unit)
    if action == "show":
        return show(unit)
    print("fake systemctl: unknown command %s" % action, file=sys.stderr)
    return 1


def journalctl(args):
    unit = args[args.index("-u") + 1]
    lines = int(args[args.index("-n") + 1]) if "-n" in args else None
    try:
        with open(os.path.join(HERE, unit + ".log"), "rb") as fh:
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        data = ""
    out = data.splitlines(True)
    sys.stdout.write("".join(out[-lines:] if lines else out))
    return 0


def sudo(args):
    with open(os.path.join(HERE, "sudo.log"), "a") as fh:
        fh.write(json.dumps(args) + "\n")
    if os.path.exists(os.path.join(HERE, "sudo-refuse")):
        print("sudo: a password is required", file=sys.stderr)
        return 1
    if args[:1] == ["-n"]:
        args = args[1:]
    env = dict(os.environ, PATH=os.path.join(HERE, "bin") + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(args, env=env).returncode


if __name__ == "__main__":
    name = os.path.basename(sys.argv[0])
    tool = {"systemctl": systemctl, "journalctl": journalctl, "sudo": sudo}[name]
    sys.exit(tool(sys.argv[1:]))
