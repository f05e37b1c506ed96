# Probe stages that must run on the host: what the server's Python imports, the kernel self-test on the host
# GPU, start-up watching (pid + log + /health polled every ~100 ms in ONE call, so a dead server is seen at
# once and not after an SSH round trip per poll), and the fixed generation prompts. Stdlib only (so its poll loops
# are written out here rather than with tenacity, which a host's Python does not have). The control side shows
# these waits (elapsed time, the server log's last line) by reading the log over a second channel meanwhile.
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time

from urllib import request as _request
from urllib.error import HTTPError as _HTTPError

from ._frame import Failure, _port_listener, _proc_alive, _write_json, server_env

TRACEBACK = b"Traceback (most recent call last)"

# Runs under the server's interpreter with the server's environment. Never imports sglang itself (that needs the
# GPU stack); resolves it with find_spec and loads only the DDTree package by file path, like the runtime loader.
_INSPECT = r'''
import importlib.util, json, os, sys, traceback
out = {"executable": sys.executable, "pythonpath": os.environ.get("PYTHONPATH", ""), "expect_real": os.path.realpath(sys.argv[4])}
spec = importlib.util.find_spec("sglang")
if spec is None or not spec.submodule_search_locations:
    out["sglang"] = None
else:
    pkg = list(spec.submodule_search_locations)[0]
    out["sglang"] = pkg
    out["sglang_real"] = os.path.realpath(pkg)
    rdir = os.path.join(pkg, *sys.argv[1].split("/"))
    init = os.path.join(rdir, "__init__.py")
    out["runtime_dir"] = os.path.realpath(rdir)
    out["runtime_present"] = os.path.isfile(init)
    if out["runtime_present"] and sys.argv[2] == "1":
        try:
            s = importlib.util.spec_from_file_location("ddtree_probe_runtime", init, submodule_search_locations=[rdir])
            m = importlib.util.module_from_spec(s)
            sys.modules["ddtree_probe_runtime"] = m
            s.loader.exec_module(m)
            out["runtime_version"] = getattr(m, "__version__", None)
            out["runtime_file"] = os.path.realpath(m.__file__)
            if sys.argv[3] == "selftest":
                fn = getattr(m, "self_test", None)
                if fn is None:
                    out["selftest"] = {"ok": False, "error": "runtime has no self_test()"}
                else:
                    out["selftest"] = json.loads(json.dumps(fn(sys.argv[5]), default=str))
        except BaseException:
            out["import_error"] = traceback.format_exc()[-3000:]
print("@@PROBE@@" + json.dumps(out))
'''


def _run_inspect(root, env, runtime_subdir, load, mode, timeout, expect="/", device="cuda"):
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-c", _INSPECT, runtime_subdir, "1" if load else "0", mode, expect, device],
                              env=server_env(root, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              cwd=root if os.path.isdir(root) else "/")
    except subprocess.TimeoutExpired:
        raise Failure("the server's Python did not finish the %s check within %.0f s" % (mode, timeout), "timeout") from None
    text = proc.stdout.decode("utf-8", "replace")
    if "@@PROBE@@" not in text:
        raise Failure("the server's Python failed the %s check (exit %d): %s"
                      % (mode, proc.returncode, proc.stderr.decode("utf-8", "replace")[-2000:]), "crash")
    out = json.loads(text.rsplit("@@PROBE@@", 1)[1].strip().splitlines()[0])
    out["seconds"] = round(time.time() - t0, 3)
    return out


def inspect(root, env, runtime_subdir, expect, load=True, budget=60.0):
    """Where the server's Python finds sglang (and ``expect`` resolved the same way), and the DDTree runtime's
    version (loaded by file path)."""
    out = _run_inspect(root, env, runtime_subdir, load, "inspect", budget, expect)
    out["gpu"] = gpu()
    return out


def gpu():
    """GPUs the host has, from nvidia-smi (absent or failing: no GPU)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"present": False, "why": "nvidia-smi not found"}
    try:
        proc = subprocess.run([exe, "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"present": False, "why": "nvidia-smi failed: %s" % exc}
    lines = [ln for ln in proc.stdout.decode("utf-8", "replace").splitlines() if ln.startswith("GPU ")]
    if proc.returncode != 0 or not lines:
        return {"present": False, "why": "nvidia-smi lists no GPU (exit %d)" % proc.returncode}
    return {"present": True, "gpus": lines}


def selftest(root, env, runtime_subdir, budget=120.0, device="cuda"):
    """Call the runtime's self_test("cuda") under the server's Python and environment."""
    return _run_inspect(root, env, runtime_subdir, True, "selftest", budget, device=device)


# -- start-up ------------------------------------------------------------------------------------------------------------
def _pid_alive_file(pid_file):
    try:
        with open(pid_file) as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return False, None
    pid = record.get("pid")
    return _proc_alive(pid, record.get("start_ticks")), pid


def _pid_alive(pid_source):
    """(alive, pid) of the server: from its unit (systemd) or its pid file (managed)."""
    if pid_source["kind"] == "systemd":
        return _pid_alive_systemd(pid_source["unit"], pid_source.get("become", ""))
    return _pid_alive_file(pid_source["path"])


def _become(source):
    return shlex.split(source.get("become") or "")


def _pid_alive_systemd(unit, become=""):
    proc = subprocess.run(_become({"become": become}) + ["systemctl", "show", unit, "-p", "MainPID", "-p", "ActiveState"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    props = dict(ln.split("=", 1) for ln in proc.stdout.decode().splitlines() if "=" in ln)
    pid = int(props.get("MainPID") or 0)
    return props.get("ActiveState") in ("active", "activating", "reloading") and pid > 0, pid or None


def _read_log(source, offset):
    """New log bytes since ``offset`` (file) or since the unit's start (journal)."""
    if source.get("kind") == "journal":
        proc = subprocess.run(_become(source) + ["journalctl", "-u", source["unit"], "--since", source.get("since", "-10min"),
                               "--no-pager", "-o", "cat"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        data = proc.stdout
        return data[offset:], len(data)
    try:
        with open(source["path"], "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return b"", offset
    return data, offset + len(data)


def _settle_log(source, offset, pid_source, deadline, quiet=0.3, cap=3.0):
    """A traceback is written in pieces: its first line can land before the exception line that names the error.
    Keep reading until the log has been quiet for ``quiet`` seconds, the process has exited (the tail is read
    after this returns), or ``cap`` seconds pass (never past the start-up deadline), so the log tail we return
    holds the whole story."""
    end = min(time.time() + cap, deadline)
    quiet_since = time.time()
    while time.time() < end:
        chunk, offset = _read_log(source, offset)
        now = time.time()
        if chunk:
            quiet_since = now
        elif now - quiet_since >= quiet:
            return
        alive, _ = _pid_alive(pid_source)
        if not alive:
            time.sleep(0.05)  # the last write of an exiting process may still be in flight
            return
        time.sleep(0.05)


def _tail_text(source, lines=40):
    data, _ = _read_log(source, 0)
    return "\n".join(data[-65536:].decode("utf-8", "replace").splitlines()[-lines:])


def _http(url, timeout, data=None):
    req = _request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with _request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except _HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(pid_source, log_source, url, budget, poll=0.1, health_timeout=5.0, then_generate=None, stall=0.0):
    """Return as soon as the outcome is known: ready (/health 200), dead (process gone), traceback (in the log),
    stalled (the log silent and /health failing for ``stall`` seconds: a wedged start fails long before the
    budget, while a real model load that keeps logging keeps its whole budget), foreign (no server of ours, but
    something else answers on the port), or timeout (budget spent). /health is polled in a thread so a slow answer
    never delays seeing a death.

    ``then_generate`` ({base_url, prompts, max_new_tokens, budget, baseline_path}): when ready, run the generation
    stage too, in this same round trip; its outcome (or its Failure) is returned under "generation" with its own
    timing, so the two stages keep their own budgets and verdicts; the server's counters after it (accept
    length, throughput) under "server_info_after"."""
    res = _wait_ready(pid_source, log_source, url, budget, poll, health_timeout, stall)
    if then_generate and res["state"] == "ready":
        g0 = time.time()
        try:
            out = generate(then_generate["base_url"], then_generate["prompts"], then_generate["max_new_tokens"],
                           then_generate["budget"], then_generate["baseline_path"])
            res["generation"] = {"ok": True, "result": out, "seconds": round(time.time() - g0, 3)}
        except Failure as exc:
            res["generation"] = {"ok": False, "error": str(exc), "seconds": round(time.time() - g0, 3)}
        res["server_info_after"] = server_info(then_generate["base_url"])
    return res


def _origin(url):
    return url.split("/", 3)[0] + "//" + url.split("/", 3)[2]


def _wait_ready(pid_source, log_source, url, budget, poll, health_timeout, stall=0.0):
    t0 = time.time()
    deadline = t0 + budget
    ready = threading.Event()
    last = {"status": None, "error": None, "polls": 0}
    stop = threading.Event()

    def poll_health():
        while not stop.is_set():
            try:
                code, _ = _http(url, timeout=min(health_timeout, max(0.2, deadline - time.time())))
                last["status"], last["error"] = code, None
                if code == 200:
                    ready.set()
                    return
            except Exception as exc:  # refused, reset, timeout: "not yet"
                last["error"] = str(getattr(exc, "reason", exc))
            last["polls"] += 1
            stop.wait(poll)

    thread = threading.Thread(target=poll_health, daemon=True)
    thread.start()
    offset = 0
    seen = b""
    state, pid = None, None
    progress_at = t0
    try:
        while True:
            alive, pid = _pid_alive(pid_source)
            if ready.is_set():
                state = "ready"
                break
            if not alive:
                state = "dead"
                break
            chunk, offset = _read_log(log_source, offset)
            now = time.time()
            if chunk:
                progress_at = now
            seen = (seen + chunk)[-(len(TRACEBACK) + 65536):]
            if TRACEBACK in seen:
                state = "traceback"
                _settle_log(log_source, offset, pid_source, deadline)
                break
            if now >= deadline:
                state = "timeout"
                break
            if stall and now - progress_at >= stall:
                state = "stalled"
                break
            ready.wait(poll)
    finally:
        stop.set()
    res = {"state": state, "seconds": round(time.time() - t0, 3), "pid": pid, "health_status": last["status"],
           "health_error": last["error"], "health_polls": last["polls"], "silent_for": round(time.time() - progress_at, 3)}
    if state == "dead" and pid is None and pid_source["kind"] == "file":
        # no server of ours at all: if something answers on the port anyway, it is a server we did not start
        try:
            code, _ = _http(url, timeout=min(health_timeout, 2.0))
        except Exception:
            code = None
        port = int(url.split("/", 3)[2].rsplit(":", 1)[1])
        holder = _port_listener(port)
        if code is not None or holder is not None:
            state = res["state"] = "foreign"
            res["health_status"] = code
            res["listener"] = holder
    if state != "ready":
        res["log_tail"] = _tail_text(log_source)
    else:
        res["server_info"] = server_info(_origin(url))
    return res


def server_info(url, timeout=5.0):
    try:
        code, body = _http(url.rstrip("/") + "/get_server_info", timeout)
    except Exception as exc:
        return {"status": None, "error": str(exc)}
    try:
        return {"status": code, "info": json.loads(body.decode("utf-8", "replace"))}
    except ValueError:
        return {"status": code, "info": None}


def generate(url, prompts, max_new_tokens, budget=60.0, baseline_path=None):
    """With ``baseline_path``: {"baseline": <recorded doc or None>, "replies": [...]}, in one round trip; the prompts
    are only sent when a baseline exists."""
    if baseline_path is not None:
        baseline = read_json(baseline_path)
        return {"baseline": baseline, "replies": _generate(url, prompts, max_new_tokens, budget) if baseline else None}
    return _generate(url, prompts, max_new_tokens, budget)


def _generate(url, prompts, max_new_tokens, budget):
    timeout = budget
    """Each prompt once at temperature 0; the tokens, text and speculative acceptance length of each reply."""
    results = []
    deadline = time.time() + timeout
    for prompt in prompts:
        body = json.dumps({"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": int(max_new_tokens)}}).encode()
        t0 = time.time()
        remaining = deadline - t0
        if remaining <= 0:
            raise Failure("generation budget of %.0f s spent before prompt %r" % (timeout, prompt), "timeout")
        try:
            code, raw = _http(url.rstrip("/") + "/generate", remaining, data=body)
        except Exception as exc:
            raise Failure("POST /generate for prompt %r failed: %s" % (prompt, getattr(exc, "reason", exc)), "http") from None
        if code != 200:
            raise Failure("POST /generate for prompt %r answered HTTP %d: %s" % (prompt, code, raw[:500].decode("utf-8", "replace")), "http")
        try:
            reply = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            raise Failure("POST /generate for prompt %r returned non-JSON: %r" % (prompt, raw[:200]), "http") from None
        meta = reply.get("meta_info") or {}
        results.append({"prompt": prompt, "output_ids": reply.get("output_ids"), "text": reply.get("text"),
                        "spec_accept_length": meta.get("spec_accept_length"), "completion_tokens": meta.get("completion_tokens"),
                        "seconds": round(time.time() - t0, 3)})
    return results


def _scrape(url, prefix, timeout):
    """(the lines of the server's ``/metrics`` whose family starts with ``prefix``, None) or (None, why not)."""
    try:
        code, body = _http(url.rstrip("/") + "/metrics", timeout)
    except Exception as exc:
        return None, "GET /metrics failed: %s" % (getattr(exc, "reason", None) or exc)
    if code != 200:
        return None, "GET /metrics answered HTTP %d (SGLang serves it with --enable-metrics)" % code

    def ours(line):  # a sample of the families, or their "# HELP name" / "# TYPE name" line
        name = (line.split(" ", 3)[2:3] or [""])[0] if line.startswith("# ") else line
        return name.startswith(prefix)

    lines = [line for line in body.decode("utf-8", "replace").splitlines() if ours(line)]
    if not any(not line.startswith("#") for line in lines):
        return None, "/metrics has none of the %s* families (no DDTree release serving, or no round decoded yet)" % prefix
    return "\n".join(lines) + "\n", None


def metrics(url, prefix, timeout=5.0):
    """The lines of the server's ``/metrics`` (Prometheus text) whose family starts with ``prefix`` (DDTree's), read
    on the host itself (the port is never reached from outside); None when the server serves no /metrics (SGLang
    without --enable-metrics) or none of those families."""
    return _scrape(url, prefix, timeout)[0]


def metrics_window(url, prefix, seconds, timeout=5.0):
    """Two reads of ``/metrics`` (the families starting with ``prefix``) ``seconds`` apart, on the host itself:
    {"before", "after", "seconds"}, ``seconds`` measured here between the middles of the two reads (no SSH in it);
    or {"error": why} when the server does not answer or serves none of them (the second read's reason if only it
    failed: a server that went down in between)."""
    t0 = time.time()
    before, why = _scrape(url, prefix, timeout)
    t1 = time.time()
    if before is None:
        return {"error": why}
    time.sleep(max(0.0, float(seconds) - (t1 - t0)))
    t2 = time.time()
    after, why = _scrape(url, prefix, timeout)
    t3 = time.time()
    if after is None:
        return {"error": why}
    return {"before": before, "after": after, "seconds": round((t2 + t3 - t0 - t1) / 2.0, 4)}


def workload(url, prompts, max_new_tokens, concurrency=1, budget=300.0, temperature=0.0, metrics_prefix=None):
    """A measured workload: every prompt once (cycled until ``concurrency`` requests can be in flight), with
    ``concurrency`` requests in flight at a time, so the server decodes them as a batch of that size. Each request
    decodes exactly ``max_new_tokens`` (ignore_eos). Per request: tokens, latency and the server's speculative
    counters; the wall time of the whole run; /get_server_info after it; with ``metrics_prefix``, the server's
    /metrics lines of those families before and after the run (``metrics``). Runs on the host: latencies carry no
    SSH."""
    concurrency = max(1, int(concurrency))
    before = metrics(url, metrics_prefix) if metrics_prefix else None
    total = max(len(prompts), concurrency)
    total += (-total) % concurrency
    jobs = [prompts[i % len(prompts)] for i in range(total)]
    results = [None] * total
    errors = []
    lock = threading.Lock()
    deadline = time.time() + float(budget)
    nxt = [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= total or errors:
                    return
                i = nxt[0]
                nxt[0] += 1
            body = json.dumps({"text": jobs[i], "sampling_params": {
                "temperature": float(temperature), "max_new_tokens": int(max_new_tokens), "ignore_eos": True}}).encode()
            t0 = time.time()
            try:
                code, raw = _http(url.rstrip("/") + "/generate", max(1.0, deadline - t0), data=body)
                reply = json.loads(raw.decode("utf-8", "replace")) if code == 200 else None
            except Exception as exc:
                code, reply, raw = None, None, str(getattr(exc, "reason", exc)).encode()
            if reply is None:
                with lock:
                    errors.append("POST /generate answered %s: %s" % (code or "no reply",
                                                                      raw[:300].decode("utf-8", "replace")))
                return
            meta = reply.get("meta_info") or {}
            results[i] = {"completion_tokens": meta.get("completion_tokens") or len(reply.get("output_ids") or []),
                          "spec_accept_length": meta.get("spec_accept_length"), "spec_verify_ct": meta.get("spec_verify_ct"),
                          "latency": round(time.time() - t0, 4)}

    t0 = time.time()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.time()) + 5.0)
    wall = time.time() - t0
    if errors:
        raise Failure("workload at batch %d: %s" % (concurrency, errors[0]), "http")
    if any(r is None for r in results):
        raise Failure("workload at batch %d did not finish within %.0f s" % (concurrency, float(budget)), "timeout")
    return {"requests": results, "seconds": round(wall, 4), "concurrency": concurrency,
            "server_info": server_info(url), "metrics_before": before,
            "metrics_after": metrics(url, metrics_prefix) if metrics_prefix else None}


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def write_json(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_json(path, data, indent=1)
    return path


OPS = {"inspect": inspect, "gpu": gpu, "selftest": selftest, "wait_ready": wait_ready, "server_info": server_info,
       "generate": generate, "workload": workload, "metrics": metrics,
       "metrics_window": metrics_window, "read_json": read_json, "write_json": write_json}
