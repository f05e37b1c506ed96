# -*- coding: utf-8 -*-
# Copyright (c) ddtree-deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host side of the ddtree.deploy modules: the package's own remote ops (``ddtree_deploy/remote``, each module's
zip packed into ``_programs.py`` when the collection is built) run as subprocesses of the host's Python exactly as the
CLI's transport runs them (the same boot line, the same framing, the same reply lines), and the deploy transaction driven
from here, in the one host process of the module, holding the host lock through the same guardian (``release.hold``).

Why this keeps the CLI's guarantee (docs/design.md, "Fleets on Ansible"): the guardian is a child of the module
process, fed a heartbeat by it; every step carries the run's fence. When the module process goes away (killed,
or its controller lost: a hang-up, or its stdout closed under it), the guardian sees the end of its input and its
parent gone and settles the run on the host itself: back to the safe release, the unprobed one marked interrupted,
the server restarted there, the lock released. Standard library only; runs on any Python >= 3.8.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import os
import select
import signal
import subprocess
import threading
import time
import zlib

from ansible_collections.ddtree.deploy.plugins.module_utils._programs import BOOT, MARKER, PROGRAMS

RUNTIME_SUBDIR = "srt/speculative/ddtree"
HEARTBEAT = 2.0
LEASE_TIMEOUT = 30.0


class HostFailure(Exception):
    """A host program's explained failure (its ``kind``: fenced, drift, lock, missing, ...)."""

    def __init__(self, message, kind="error", data=None):
        Exception.__init__(self, message)
        self.message = message
        self.kind = kind
        self.data = data or {}


# -- running a host program ----------------------------------------------------------------------------------------------
def _framed(module, op, args):
    """What the boot line reads: the module's compressed zip and the request, each preceded by its length (8 bytes)."""
    program = base64.b64decode(PROGRAMS[module])
    payload = json.dumps({"module": module, "op": op, "args": args}).encode()
    return (len(program).to_bytes(8, "big") + program + len(payload).to_bytes(8, "big") + payload)


def _parse_replies(data):
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith(MARKER):
            try:
                out.append(json.loads(line[len(MARKER):]))
            except ValueError:
                continue
    return out


def _reply_value(reply, what):
    if reply.get("ok"):
        return reply.get("result")
    raise HostFailure(str(reply.get("error")), reply.get("kind") or "error")


def call(python, module, op, args, stdin=b"", timeout=None):
    """One host program op in its own process (a session of its own, so a hang-up of the module's terminal does
    not cut a step half way: the fence stops it from committing instead); its result, or HostFailure."""
    proc = subprocess.Popen([python, "-c", BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, cwd="/")
    try:
        out, err = proc.communicate(_framed(module, op, args) + (stdin or b""), timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise HostFailure("%s.%s did not answer within %.0f s" % (module, op, timeout), "timeout")
    replies = _parse_replies(out)
    if not replies:
        raise HostFailure("%s.%s gave no reply (exit %s): %s" % (module, op, proc.returncode,
                                                                  err.decode("utf-8", "replace")[-2000:]), "crash")
    return _reply_value(replies[-1], op)


class Guardian:
    """The host lock of this run, held by ``release.hold`` in a child process fed a heartbeat from here."""

    def __init__(self, python, root, owner, guard, break_lock=False, lease_timeout=LEASE_TIMEOUT):
        self.guard = guard or {}
        self.proc = subprocess.Popen([python, "-c", BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")
        self._buf = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost = None
        args = {"root": root, "owner": owner, "break_lock": break_lock, "guard": guard, "lease_timeout": lease_timeout}
        self._send(_framed("release", "hold", args))
        self.first = _reply_value(self._reply(120.0), "hold")
        if self.first.get("acquired"):
            self._thread = threading.Thread(target=self._beat)
            self._thread.daemon = True
            self._thread.start()
        else:
            self._close()

    def _send(self, data):
        with self._lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def _reply(self, timeout):
        fd = self.proc.stdout.fileno()
        deadline = time.time() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                got = _parse_replies(line)
                if got:
                    return got[0]
            left = deadline - time.time()
            if left <= 0:
                raise HostFailure("the host lock's guardian did not answer within %.0f s" % timeout, "timeout")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise HostFailure("the host lock's guardian ended without an answer", "crash")
                self._buf += chunk

    def _beat(self):
        while not self._stop.wait(HEARTBEAT):
            if not self._send(b"hb\n") or self.proc.poll() is not None:
                self.lost = "the host lock's guardian ended while the run held the lock"
                return

    def settle_budget(self):
        return 60.0 + float(self.guard.get("stop_timeout", 20.0)) + float(self.guard.get("startup_timeout", 0.0))

    def _end(self, line):
        self._stop.set()
        try:
            if not self._send(line):
                return None
            return _reply_value(self._reply(self.settle_budget()), "hold")
        except HostFailure:
            return None
        finally:
            self._close()

    def _close(self):
        for fh in (self.proc.stdin, self.proc.stdout):
            try:
                fh.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def release(self):
        return self._end(b"release\n")

    def abandon(self, why):
        return self._end(("abandon " + why.replace("\n", " ")[:300] + "\n").encode())


class ControllerWatch:
    """While the transaction runs: the controller is lost when the module's stdout closes under it (a blank line is
    written every second; Ansible drops whitespace before a module's JSON) or a hang-up / SIGTERM arrives. The
    module process then ends at once, leaving the run to its guardian (which settles it, as for a CLI that was
    killed); a step in flight is fenced."""

    def __init__(self, interval=1.0):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
            try:
                self._old[sig] = signal.signal(sig, self._gone)
            except (OSError, ValueError):
                pass
        self._thread = threading.Thread(target=self._run)
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for sig, old in self._old.items():
            try:
                signal.signal(sig, old)
            except (OSError, ValueError):
                pass
        return False

    @staticmethod
    def _gone(*_args):
        os._exit(1)  # the guardian sees its input end and its parent gone, and settles the run

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                os.write(1, b"\n")
            except OSError:
                self._gone()


# -- reading the host --------------------------------------------------------------------------------------------------
class Host:
    """One host as the plan (made by ``ddtree-deploy`` on the controller) describes it."""

    def __init__(self, plan, python=None):
        self.plan = plan
        self.python = python or plan["python"]
        self.root = plan["release_root"]
        self.probe = plan.get("probe") or {}
        self.spec = plan.get("server_spec") or {}
        self.guard = plan.get("guard")
        self.run_id = None

    def call(self, module, op, timeout=None, stdin=b"", **args):
        return call(self.python, module, op, args, stdin=stdin, timeout=timeout)

    def fenced(self, module, op, timeout=None, stdin=b"", **args):
        args["fence"] = self.run_id
        return self.call(module, op, timeout=timeout, stdin=stdin, **args)

    def show(self):
        return self.call("release", "show", timeout=60, root=self.root)

    def launch(self):
        return self.call("server", "launch", timeout=60, root=self.root)

    def release_meta(self, release):
        if not release:
            return {}
        try:
            with open(os.path.join(self.root, "releases", release, "RELEASE.json")) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}


def _sha256(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def overlay_diff(host, state):
    """The files the overlay would change against what the server imports now (the active release, or the
    installed package): [{path, action, before, after}]. Reads only."""
    active = state.get("active")
    top = os.path.join(host.root, "releases", active) if active else host.plan["site_packages"]
    out = []
    for f in host.plan["overlay"]["files"]:
        before = _sha256(os.path.join(top, f["path"]))
        if before != f["sha256"]:
            out.append({"path": f["path"], "action": "add" if before is None else "modify", "before": before,
                        "after": f["sha256"]})
    return out


def diff_text(changes, state, release="the new release"):
    lines = ["%s %s" % ("+" if c["action"] == "add" else "~", c["path"]) for c in changes]
    return {"before_header": "release %s" % state.get("active") if state.get("active") else "the installed package",
            "after_header": release, "prepared": "\n".join(lines) + ("\n" if lines else "")}


def launch_matches(host, launch):
    """The running server was started with the host file's line (DDTree on) and environment."""
    if not launch or not launch.get("launch"):
        return False
    if str(launch["launch"]).strip() != str(host.plan.get("wanted_launch") or "").strip():
        return False
    if launch.get("ddtree") is not None and not launch["ddtree"]:
        return False
    return "env" not in launch or dict(launch.get("env") or {}) == dict(host.spec.get("env") or {})


def decide(host, state, launch):
    """unchanged | restart (same release, the server's flags differ) | deploy; and why."""
    active = state.get("active")
    rel = next((r for r in state.get("releases", []) if r["id"] == active), None) if active else None
    digest = host.plan["overlay"]["digest"]
    holds = bool(rel and rel.get("overlay_digest") == digest and rel.get("status") == "good")
    if holds and not host.plan.get("force"):
        if launch_matches(host, launch):
            return "unchanged", "release %s already holds this overlay and the server runs the host file's flags" % active
        return "restart", "release %s holds this overlay; the server's flags differ from the host file" % active
    if holds:
        return "deploy", "force: release %s already holds this overlay; redone as a new release" % active
    if active:
        return "deploy", ("the overlay differs from the one release %s holds" % active if rel and rel.get("status") == "good"
                          else "release %s is not marked good" % active)
    return "deploy", "no overlay is active"


def rollback_target(state, failed):
    """As the CLI's hoststate.ReleaseState.rollback_target: the previous good release unless bad or gone, else the
    newest good one, else None (the installed package)."""
    releases = dict((r["id"], r) for r in state.get("releases", []))
    bad = set(state.get("bad", [])) | (set([failed]) if failed else set())
    prev = state.get("previous_good")
    if prev is None:
        return None
    if prev not in bad and prev in releases and releases[prev].get("exists", True):
        return prev
    for rel in reversed(state.get("releases", [])):
        if rel["id"] not in bad and rel.get("status") == "good" and rel.get("exists", True):
            return rel["id"]
    return None


# -- the probe (the CLI's four stages, judged the same way) ------------------------------------------------------------------
def _stage(name, status, t0, detail="", data=None, log_tail=""):
    return {"name": name, "status": status, "seconds": round(time.time() - t0, 3), "detail": detail,
            "data": data or {}, "log_tail": log_tail}


class Prober:
    def __init__(self, host):
        self.host = host
        self.gpu = None
        self.runtime = False
        self.info = None

    def expected(self, release):
        if release is None:
            return os.path.join(self.host.plan["site_packages"], "sglang")
        return os.path.join(self.host.root, "releases", release, "sglang")

    def overlay(self, release):
        t0 = time.time()
        p = self.host.probe
        budget = float(p.get("overlay_timeout", 60.0))
        try:
            got = self.host.call("probe", "inspect", timeout=budget + 30, root=self.host.root, env=p.get("env") or {},
                                 runtime_subdir=RUNTIME_SUBDIR, expect=self.expected(release),
                                 load=release is not None, budget=budget)
        except HostFailure as exc:
            if exc.kind == "fenced":
                raise
            return _stage("overlay", "fail", t0, exc.message)
        self.gpu = got.get("gpu")
        if got.get("sglang_real") is None:
            return _stage("overlay", "fail", t0, "the server's Python (%s) finds no sglang" % got.get("executable"))
        if got.get("sglang_real") != got.get("expect_real"):
            return _stage("overlay", "fail", t0, "the server's Python resolves sglang to %s, expected %s"
                          % (got.get("sglang_real"), self.expected(release)))
        if release is None:
            self.runtime = False
            return _stage("overlay", "pass", t0, "no overlay active: sglang from the installed package %s" % got["sglang_real"])
        if not got.get("runtime_present"):
            return _stage("overlay", "fail", t0, "release %s has no DDTree package at %s" % (release, got.get("runtime_dir")))
        if got.get("import_error"):
            return _stage("overlay", "fail", t0, "loading the DDTree package from the release failed",
                          log_tail=got["import_error"])
        version = got.get("runtime_version")
        if not version:
            return _stage("overlay", "fail", t0, "DDTree package at %s has no __version__" % got.get("runtime_file"))
        self.runtime = True
        return _stage("overlay", "pass", t0, "sglang from release %s; DDTree runtime %s" % (release, version))

    def selftest(self, release):
        t0 = time.time()
        if release is None or not self.runtime:
            return _stage("selftest", "skip", t0, "no DDTree runtime active")
        gpu = self.gpu
        if gpu is None:
            try:
                gpu = self.host.call("probe", "gpu", timeout=60)
            except HostFailure as exc:
                return _stage("selftest", "skip", t0, "skipped: cannot query nvidia-smi (%s)" % exc.message)
        if not gpu.get("present"):
            return _stage("selftest", "skip", t0, "skipped: no GPU on this host (%s)" % gpu.get("why", ""))
        p = self.host.probe
        budget = float(p.get("selftest_timeout", 120.0))
        try:
            got = self.host.call("probe", "selftest", timeout=budget + 30, root=self.host.root, env=p.get("env") or {},
                                 runtime_subdir=RUNTIME_SUBDIR, budget=budget)
        except HostFailure as exc:
            return _stage("selftest", "fail", t0, exc.message)
        result = got.get("selftest") or {}
        if got.get("import_error"):
            return _stage("selftest", "fail", t0, "loading the runtime for the self-test failed", log_tail=got["import_error"])
        if not result.get("ok"):
            bad = [k for k, v in (result.get("checks") or {}).items() if not v]
            return _stage("selftest", "fail", t0, "kernel self-test failed on %s: %s"
                          % (result.get("device"), ", ".join(bad) or result.get("error")))
        return _stage("selftest", "pass", t0, "kernels agree with references on %s" % result.get("device"))

    def serving(self, release):
        """startup and generation, in one host call (wait_ready with the generation after it)."""
        t0 = time.time()
        p = self.host.probe
        budget = float(p.get("startup_timeout", 600.0))
        prompts = list(p.get("prompts") or [])
        gen_budget = float(p.get("generation_timeout", 60.0))
        then = None
        if prompts:
            then = {"base_url": p["base_url"], "prompts": prompts, "max_new_tokens": int(p.get("max_new_tokens", 32)),
                    "budget": gen_budget, "baseline_path": p["baseline_path"]}
        stall = float(p.get("startup_stall_timeout", 0.0))
        try:
            got = self.host.call("probe", "wait_ready", timeout=budget + gen_budget + 30, pid_source=p["pid_source"],
                                 log_source=p["log_source"], url=p["health_url"], budget=budget, poll=0.1,
                                 then_generate=then, stall=stall if stall < budget else 0.0)
        except HostFailure as exc:
            return [_stage("startup", "fail", t0, exc.message), _stage("generation", "not-run", time.time())]
        gen = got.get("generation")
        state = got["state"]
        tail = got.get("log_tail", "")
        data = dict((k, got.get(k)) for k in ("state", "seconds", "pid", "health_status"))
        if state != "ready":
            what = {"dead": "the server is not running (seen %.2f s into start-up)" % float(got.get("seconds") or 0),
                    "traceback": "a traceback appeared in the server log after %.2f s" % float(got.get("seconds") or 0),
                    "stalled": "start-up made no progress (the server log silent, /health failing)",
                    "timeout": "/health did not answer 200 within the start-up budget of %g s" % budget,
                    "foreign": "no server started by ddtree-deploy runs on this host, but %s answers" % p["health_url"]}
            return [_stage("startup", "fail", t0, what.get(state, state), data, tail),
                    _stage("generation", "not-run", time.time(), "an earlier stage failed")]
        self.info = {"before": (got.get("server_info") or {}).get("info"),
                     "after": (got.get("server_info_after") or {}).get("info")}
        startup = _stage("startup", "pass", t0, "/health 200 after %.2f s (pid %s)" % (got["seconds"], got.get("pid")), data)
        if gen is not None:
            startup["seconds"] = round(max(0.0, startup["seconds"] - float(gen.get("seconds") or 0.0)), 3)
        return [startup, self._generation(gen, prompts)]

    def _generation(self, gen, prompts):
        t0 = time.time()
        p = self.host.probe
        if not prompts:
            return _stage("generation", "skip", t0, "no probe.prompts in the host file")
        if not gen["ok"]:
            return _stage("generation", "fail", t0, gen["error"])
        t0 -= float(gen.get("seconds") or 0.0)
        baseline, replies = gen["result"]["baseline"], gen["result"]["replies"]
        self.info["replies"] = replies
        if baseline is None:
            return _stage("generation", "skip", t0, "no baseline recorded at %s" % p["baseline_path"])
        if baseline.get("prompts") != prompts or baseline.get("max_new_tokens") != int(p.get("max_new_tokens", 32)):
            return _stage("generation", "fail", t0, "the recorded baseline was made with other prompts or max_new_tokens "
                          "than the host file now has; re-record it")
        accept = [r["spec_accept_length"] for r in replies if isinstance(r.get("spec_accept_length"), (int, float))]
        mean = round(sum(accept) / len(accept), 3) if accept else None
        data = {"spec_accept_length": mean, "prompts": len(replies)}
        for got, want in zip(replies, baseline["outputs"]):
            key = "output_ids" if got.get("output_ids") is not None and want.get("output_ids") is not None else "text"
            if got.get(key) != want.get(key):
                return _stage("generation", "fail", t0, "prompt %r: output differs from the baseline" % got["prompt"], data)
        least = float(p.get("min_accept_length", 0.0) or 0.0)
        if least and (mean is None or mean < least):
            return _stage("generation", "fail", t0, "speculative acceptance length %s below probe.min_accept_length %s"
                          % (mean, least), data)
        acc = "; spec_accept_length %s" % mean if mean is not None else ""
        return _stage("generation", "pass", t0, "%d prompts match the baseline token for token%s" % (len(replies), acc), data)

    def check(self, release):
        first = self.overlay(release)
        if first["status"] == "fail":
            return [first, _stage("selftest", "not-run", time.time(), "an earlier stage failed")]
        return [first, self.selftest(release)]

    def result(self, release, stages, label):
        ok = all(s["status"] in ("pass", "skip") for s in stages) and any(s["status"] == "pass" for s in stages)
        return {"host": self.host.plan["host"], "label": label, "release": release, "ok": ok,
                "seconds": round(sum(s["seconds"] for s in stages), 3), "stages": stages, "server_info": self.info}

    def run(self, release, label="probe"):
        stages = self.check(release)
        if not any(s["status"] == "fail" for s in stages):
            stages += self.serving(release)
        else:
            stages += [_stage(n, "not-run", time.time(), "an earlier stage failed") for n in ("startup", "generation")]
        return self.result(release, stages, label)


def failed_stage(probe):
    return next((s for s in probe["stages"] if s["status"] == "fail"), None) if probe else None


# -- the transaction ------------------------------------------------------------------------------------------------------
def new_run_id():
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


def owner_record(run_id, command):
    import getpass
    import socket
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return {"run_id": run_id, "user": getpass.getuser(), "control_host": socket.gethostname(),
            "control_pid": os.getpid(), "control_boot_id": boot, "command": command}


def report(host, status, message="", exit_code=0, **fields):
    out = {"host": host.plan["host"], "status": status, "ok": status in ("ok", "unchanged", "dry-run"),
           "message": message, "exit_code": exit_code, "release": None, "previous": None, "rolled_back_to": None,
           "push": None, "probe": None, "rollback_probe": None, "timings": {}, "details": {}}
    out.update(fields)
    return out


class Locked:
    """The host lock for one module run (the guardian), settling what a vanished run left pending first."""

    def __init__(self, host, command, break_lock=False):
        self.host, self.command, self.break_lock = host, command, break_lock
        self.guardian = None
        self.info = None
        self.settled = None

    def __enter__(self):
        host = self.host
        host.run_id = host.plan.get("run_id") or new_run_id()
        self.guardian = Guardian(host.python, host.root, owner_record(host.run_id, self.command), host.guard,
                                 self.break_lock)
        info = self.guardian.first
        if not info.get("acquired"):
            holder = info.get("holder") or {}
            raise HostFailure("host %s: deploy lock %s/lock is held by run %s (%s@%s, `%s`); refusing to interleave"
                              % (host.plan["host"], host.root, holder.get("run_id"), holder.get("user"),
                                 holder.get("control_host"), holder.get("command")), "lock", {"holder": holder})
        self.info = info
        pending = info["state"].get("pending")
        if pending:
            out = host.fenced("release", "reconcile", timeout=120 + float(host.probe.get("startup_timeout", 0)),
                              root=host.root, run_id=host.run_id, why="left pending by run %s" % pending.get("run"),
                              guard=host.guard)
            self.settled = out
            info["state"] = host.show()["state"]
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None:
            self.guardian.release()
        else:
            why = exc.message if isinstance(exc, HostFailure) else "%s: %s" % (kind.__name__, exc)
            self.outcome = self.guardian.abandon("the module failed: %s" % why)
            if isinstance(exc, HostFailure) and self.outcome is not None:
                exc.data["settled"] = self.outcome
        return False


def _finish(host, release_id, status, event, note="", **fields):
    fields.setdefault("by", "ansible (ddtree.deploy)")
    res = host.fenced("release", "finish", timeout=120, root=host.root, release_id=release_id, status=status,
                      keep=int(host.plan.get("keep_releases", 5)), run_id=host.run_id, event=event, fields=fields, note=note)
    return res["removed"]


def _restart(host, release, ddtree=True):
    return host.fenced("release", "server_action", timeout=float(host.spec.get("stop_timeout", 20.0)) + 120,
                       root=host.root, spec=host.spec, action="restart", release=release, ddtree=ddtree)


def record_baseline(host, active):
    """Restart with DDTree off, generate the fixed prompts, write the baseline, restart as configured (the CLI's
    baseline.record_baseline)."""
    p = host.probe
    _restart(host, active, ddtree=False)
    try:
        got = host.call("probe", "wait_ready", timeout=float(p.get("startup_timeout", 600)) + 30, pid_source=p["pid_source"],
                        log_source=p["log_source"], url=p["health_url"], budget=float(p.get("startup_timeout", 600)),
                        poll=0.1)
        if got["state"] != "ready":
            raise HostFailure("cannot record a baseline: the server did not come up with DDTree off (%s)" % got["state"])
        replies = host.call("probe", "generate", timeout=float(p.get("generation_timeout", 60)) + 30, url=p["base_url"],
                            prompts=list(p["prompts"]), max_new_tokens=int(p.get("max_new_tokens", 32)),
                            budget=float(p.get("generation_timeout", 60)))
    finally:
        _restart(host, active, ddtree=active is not None)
    doc = {"recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host.plan["host"], "ddtree": False,
           "release": active, "prompts": list(p["prompts"]), "max_new_tokens": int(p.get("max_new_tokens", 32)),
           "outputs": [{"prompt": r["prompt"], "output_ids": r.get("output_ids"), "text": r.get("text")} for r in replies]}
    host.call("probe", "write_json", timeout=30, path=p["baseline_path"], data=doc)


def server_running(host):
    if host.spec.get("kind") == "systemd":
        return host.call("server", "systemd_status", timeout=60, unit=host.spec["unit"],
                         become=host.spec.get("become", ""))["running"]
    return host.call("server", "status", timeout=60, root=host.root)["running"]


def roll_back(host, rep, failed, why, restarted):
    """Back to the previous good release, mark ``failed`` bad, restart there when needed, probe again."""
    state = host.show()["state"]
    target = rollback_target(state, failed)
    running = server_running(host)
    host.fenced("release", "roll_back", timeout=float(host.spec.get("stop_timeout", 20.0)) + 90, root=host.root,
                target=target, failed=failed, run_id=host.run_id, note=why[:500],
                spec=host.spec if (restarted or not running) else None)
    rep["rolled_back_to"] = target
    where = "release %s" % target if target else "the installed package (no overlay)"
    second = Prober(host).run(target, label="after rollback")
    rep["rollback_probe"] = second
    rep["exit_code"] = 1
    if second["ok"]:
        rep["status"] = "rolled-back"
        rep["message"] = "%s; rolled back to %s, which passes its probe" % (why, where)
        _finish(host, target, "good" if target else None, "apply", release=failed, outcome="rolled-back",
                rolled_back_to=target, why=why[:500])
    else:
        stage = failed_stage(second) or {}
        rep["status"] = "rollback-failed"
        rep["message"] = "%s; ROLLBACK TO %s ALSO FAILED its probe (%s: %s) — the host needs attention" % (
            why, where.upper(), stage.get("name"), stage.get("detail"))
        _finish(host, None, None, "apply", release=failed, outcome="rollback-failed", rolled_back_to=target, why=why[:500])


def _why(probe):
    stage = failed_stage(probe)
    return "probe stage %s failed: %s" % (stage["name"], stage["detail"]) if stage else "probe failed"


def apply(plan, overlay_tar, check_mode=False, python=None, command="ansible ddtree.deploy.ddtree_release"):
    """The CLI's apply from the lock on (deploy.deploy_overlay), in this one host process. Returns the module
    result: changed, the report (the CLI's ApplyReport as a dict), and the diff of files that would change."""
    host = Host(plan, python)
    t0 = time.time()
    shown = host.show()
    state = shown["state"]
    changes = overlay_diff(host, state)
    decision, why = decide(host, state, host.launch())
    if check_mode:
        if state.get("pending"):
            decision, why = "deploy", "a release left pending by run %s is settled first" % state["pending"].get("run")
        rep = report(host, "dry-run", why, previous=state.get("active"),
                     details={"decision": decision, "files": changes, "would_change": decision != "unchanged"})
        return {"changed": decision != "unchanged", "report": rep, "diff": diff_text(changes, state)}
    with Locked(host, command, bool(plan.get("break_lock"))) as lock:
        state = lock.info["state"]
        decision, why = decide(host, state, host.launch())
        rep = _execute(host, lock, state, decision, why, overlay_tar)
    if lock.settled:
        rep["details"]["reconciled"] = lock.settled
    rep["timings"]["total"] = round(time.time() - t0, 3)
    changed = rep["status"] != "unchanged" or bool(lock.settled and lock.settled.get("action") != "none")
    return {"changed": changed, "report": rep, "diff": diff_text(changes, state, rep.get("release") or "new release")}


def _execute(host, lock, state, decision, why, overlay_tar):
    previous = state.get("active")
    timings = {}
    if decision == "unchanged":
        probe = Prober(host).run(previous, label="probe (unchanged)")
        if probe["ok"]:
            _finish(host, None, None, "apply", release=previous, outcome="unchanged")
            return report(host, "unchanged", "release %s already holds this overlay and passes its probe: unchanged "
                          "(no new release, no restart)" % previous, release=previous, previous=previous, probe=probe,
                          details={"decision": why})
        decision, why = "deploy", "release %s holds this overlay but fails its probe (%s); deploying it again" % (
            previous, _why(probe))
    if decision == "restart":
        t = time.time()
        stages = Prober(host).check(previous)
        if not any(s["status"] == "fail" for s in stages):
            try:
                _restart(host, previous)
                stages += Prober(host).serving(previous)
            except HostFailure as exc:
                if exc.kind == "fenced":
                    raise
                stages.append(_stage("startup", "fail", t, exc.message))
        prober = Prober(host)
        probe = prober.result(previous, stages, "probe")
        timings["probe"] = round(time.time() - t, 3)
        if probe["ok"]:
            _finish(host, None, None, "apply", release=previous, outcome="restarted")
            return report(host, "ok", "release %s restarted with the host file's flags and healthy" % previous,
                          release=previous, previous=previous, probe=probe, timings=timings, details={"decision": why})
        _finish(host, None, None, "apply", release=previous, outcome="failed", why=_why(probe)[:500])
        return report(host, "failed", "%s; the server runs release %s with the host file's new flags and fails its probe "
                      "(nothing to roll back to): fix the host file's server flags" % (_why(probe), previous), 1,
                      release=previous, previous=previous, probe=probe, timings=timings, details={"decision": why})
    plan = host.plan
    if plan.get("record_baseline", True) and host.probe.get("prompts") and not lock.info.get("has_baseline"):
        t = time.time()
        record_baseline(host, previous)
        timings["baseline"] = round(time.time() - t, 3)
    ov = plan["overlay"]
    rid = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + ov["digest"][:8]
    staging = os.path.join(host.root, "staging", host.run_id)
    t = time.time()
    meta = dict(plan.get("meta") or {})
    meta["run_id"] = host.run_id
    pushed = host.fenced("release", "receive", timeout=float(plan.get("command_timeout", 600)), stdin=overlay_tar,
                         root=host.root, staging=staging, site_packages=plan["site_packages"], package=ov["package"],
                         release_id=rid, files=ov["files"], meta=meta, keep=int(plan.get("keep_releases", 5)),
                         base_hashes=plan.get("base_hashes"), allow_base_drift=bool(plan.get("allow_base_drift")))
    host.fenced("release", "switch", timeout=120, root=host.root, release_id=rid, run_id=host.run_id, reason="deploy",
                mark_bad=None, note="", probing=True)
    timings["push_switch"] = round(time.time() - t, 3)
    push = {"release": rid, "seconds": timings["push_switch"], "link_mode": pushed.get("link_mode"),
            "files": pushed.get("files"), "bytes": len(overlay_tar)}
    t = time.time()
    prober = Prober(host)
    stages = prober.check(rid)
    restarted = False
    if not any(s["status"] == "fail" for s in stages):
        try:
            restarted = True
            _restart(host, rid)
            stages += prober.serving(rid)
        except HostFailure as exc:
            if exc.kind == "fenced":
                raise
            stages.append(_stage("startup", "fail", t, exc.message))
    else:
        stages += [_stage(n, "not-run", time.time(), "an earlier stage failed") for n in ("startup", "generation")]
    probe = prober.result(rid, stages, "probe")
    timings["probe"] = round(time.time() - t, 3)
    rep = report(host, "ok", release=rid, previous=previous, push=push, probe=probe, timings=timings,
                 details={"decision": why, "base_drift": pushed.get("base_drift") or []})
    if probe["ok"]:
        rep["details"]["removed_releases"] = _finish(host, rid, "good", "apply", release=rid, outcome="ok",
                                                     previous=previous)
        rep["message"] = "release %s active and healthy" % rid
        return rep
    t = time.time()
    roll_back(host, rep, rid, _why(probe), restarted)
    timings["rollback"] = round(time.time() - t, 3)
    return rep


def probe(plan, python=None):
    """The probe of the server as it runs (no lock, nothing written): the CLI's ``probe`` without a baseline."""
    host = Host(plan, python)
    state = host.show()["state"]
    return Prober(host).run(state.get("active"), label="probe"), state


def metrics_window(plan, prefix, seconds, python=None):
    """Two reads of the server's ``prefix`` metric families ``seconds`` apart, on the host (the remote op
    ``probe.metrics_window``): the raw reads for the controller's live figures, or ``{"error": why}``; never raises
    for a server that does not answer (a read, not a stage of the probe)."""
    host = Host(plan, python)
    if not host.probe.get("base_url"):
        return {"error": "no server configured (server.kind: none)"}
    try:
        return host.call("probe", "metrics_window", timeout=float(seconds) + 30, url=host.probe["base_url"],
                         prefix=prefix, seconds=float(seconds))
    except HostFailure as exc:
        return {"error": "cannot read the server's counters: %s" % exc.message}


def rollback(plan, to=None, to_installed=False, check_mode=False, python=None, command="ansible ddtree.deploy.ddtree_rollback"):
    """Back by hand (the CLI's ``rollback``): to ``to``, the installed package, or the previous good release; the
    release left is marked bad; the server restarted there and probed."""
    host = Host(plan, python)
    state = host.show()["state"]
    active = state.get("active")
    target = None if to_installed else (to or rollback_target(state, active))
    if not to_installed and to is None and active is None:
        rep = report(host, "unchanged", "no overlay is active: nothing to roll back", previous=None)
        return {"changed": False, "report": rep}
    if target is not None and target not in [r["id"] for r in state.get("releases", [])]:
        raise HostFailure("host %s: no release %s (have: %s)" % (plan["host"], target,
                          ", ".join(r["id"] for r in state.get("releases", [])) or "none"), "missing")
    if target == active:
        rep = report(host, "unchanged", "the host is already on %s" % (target or "the installed package"),
                     release=active, previous=active)
        return {"changed": False, "report": rep}
    if check_mode:
        rep = report(host, "dry-run", "would roll back from %s to %s" % (active, target or "the installed package"),
                     previous=active, rolled_back_to=target)
        return {"changed": True, "report": rep}
    with Locked(host, command, bool(plan.get("break_lock"))):
        host.fenced("release", "roll_back", timeout=float(host.spec.get("stop_timeout", 20.0)) + 90, root=host.root,
                    target=target, failed=active, run_id=host.run_id, note="rollback by hand (ansible)", spec=host.spec)
        probe_result = Prober(host).run(target, label="after rollback")
        ok = probe_result["ok"]
        _finish(host, target if ok else None, "good" if ok and target else None, "rollback", release=active,
                outcome="rolled-back" if ok else "rollback-failed", rolled_back_to=target)
    where = "release %s" % target if target else "the installed package"
    rep = report(host, "rolled-back" if ok else "rollback-failed",
                 "rolled back to %s%s" % (where, "" if ok else ", which FAILS its probe"), 0 if ok else 1,
                 release=target, previous=active, rolled_back_to=target, probe=probe_result)
    return {"changed": True, "report": rep}
