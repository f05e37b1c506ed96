"""Stage 3, ``startup`` (the server as it runs): pid + log + ``/health`` polled ON the host every ~100 ms in one remote
call: a dead process or a traceback in the log fails at once, ``/health`` 200 must come within the start-up budget,
and a start whose log stays silent while /health fails for ``probe.startup_stall_timeout`` seconds is wedged and
fails then (a real model load keeps logging, so it keeps its whole budget). A server we did not start answering on
the port is named as such. With ``ProbeRun.prefetch`` the same round trip runs the generation on the host once the
server is ready, for the generation stage, and reads SGLang's server info around it."""

from __future__ import annotations

import posixpath
import time

from ..errors import ConnectionCut, DeployError
from ..hoststate import HostLayout
from ..inventory import probe_setting
from ..server import base_url, managed_paths
from .result import ProbeRun, Probing, Stage
from .sources import RUNTIME_SUBDIR, expected_sglang_dir, log_source, pid_source

NAME = "startup"
NEEDS_SERVER = True


def run(p: Probing, release: str | None, ctx: ProbeRun) -> Stage:
    host = p.host
    t0 = time.monotonic()
    budget = float(probe_setting(host, "startup_timeout"))
    url = base_url(host) + str(probe_setting(host, "health_path"))
    try:
        prompts = list(probe_setting(host, "prompts") or [])
        gen_budget = float(probe_setting(host, "generation_timeout"))
        then = {"base_url": base_url(host), "prompts": prompts, "max_new_tokens": int(probe_setting(host, "max_new_tokens")),
                "budget": gen_budget, "baseline_path": HostLayout.of(host).baseline} if prompts and ctx.prefetch else None
        stall = float(probe_setting(host, "startup_stall_timeout"))
        got = p.call("wait_ready", budget + (gen_budget if then else 0.0), pid_source=pid_source(host),
                     log_source=log_source(host), url=url, budget=budget, poll=0.1, then_generate=then,
                     stall=stall if stall < budget else 0.0)
        ctx.generation = got.get("generation")
        ctx.info = (got.get("server_info") or {}).get("info")
        ctx.info_after = (got.get("server_info_after") or {}).get("info")
        if ctx.generation:  # its time belongs to the generation stage
            t0 += float(ctx.generation.get("seconds") or 0.0)
    except DeployError as exc:
        if isinstance(exc, ConnectionCut):
            raise
        return Stage(NAME, "fail", time.monotonic() - t0, str(exc))
    seconds = time.monotonic() - t0
    state = got["state"]
    data = {k: got.get(k) for k in ("state", "seconds", "pid", "health_status", "health_polls")}
    tail = got.get("log_tail", "")
    if state == "foreign":
        holder = got.get("listener") or {}
        who = f"pid {holder['pid']} ({holder.get('cmdline')})" if holder.get("pid") else "a process we cannot see"
        return Stage(NAME, "fail", seconds,
                     f"no server started by ddtree-deploy runs on this host, but {url} answers "
                     f"(HTTP {got.get('health_status') or 'no reply'}) from {who} on port {host.server.get('port')}: "
                     "a server the tool did not start; stop it, or `ddtree-deploy server restart` after stopping it",
                     dict(data, listener=holder), tail)
    if state == "dead":
        pid = got.get("pid")
        what = f"the server process (pid {pid}) is not running" if pid else \
            f"the server is not running (no live pid file under {posixpath.dirname(managed_paths(host).pid_file)})"
        return Stage(NAME, "fail", seconds, f"{what} (seen {got['seconds']:.2f} s into start-up)", data, tail)
    if state == "stalled":
        return Stage(NAME, "fail", seconds, f"start-up made no progress: the server log was silent and /health "
                     f"failing for {got.get('silent_for', 0):.0f} s (probe.startup_stall_timeout "
                     f"{probe_setting(host, 'startup_stall_timeout'):g} s; last: "
                     f"{got.get('health_status') or got.get('health_error')})", data, tail)
    if state == "traceback":
        return Stage(NAME, "fail", seconds, f"a traceback appeared in the server log after {got['seconds']:.2f} s", data, tail)
    if state == "timeout":
        return Stage(NAME, "fail", seconds, f"/health did not answer 200 within the start-up budget of {budget:g} s "
                     f"(last: {got.get('health_status') or got.get('health_error')})", data, tail)
    info = (got.get("server_info") or {}).get("info") or {}
    served_by = info.get("pid")
    if isinstance(served_by, int) and got.get("pid") and served_by != got.get("pid"):
        return Stage(NAME, "fail", time.monotonic() - t0,
                     f"{url} is answered by another process (pid {served_by}), not by the server we started "
                     f"(pid {got.get('pid')}): is an old server still holding port {host.server.get('port')}?",
                     data, p.log_tail())
    runtime_path = info.get("ddtree_runtime_path")
    data["server_runtime_path"] = runtime_path
    if runtime_path and release is not None:
        want = posixpath.join(expected_sglang_dir(host, release), RUNTIME_SUBDIR)
        if posixpath.normpath(runtime_path) != posixpath.normpath(want):
            return Stage(NAME, "fail", time.monotonic() - t0,
                         f"the running server loaded the DDTree runtime from {runtime_path}, not from release {release}", data)
    return Stage(NAME, "pass", time.monotonic() - t0, f"/health 200 after {got['seconds']:.2f} s (pid {got.get('pid')})", data)
