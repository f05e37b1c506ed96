"""Fail-fast probes of a host's server after a deploy (and on demand): four stages, each with its own budget.

1. ``overlay``   the server's Python, with the server's environment, resolves ``sglang`` to the active release
                 and loads the DDTree package from it by file path (never importing sglang: that needs the GPU
                 stack); its ``__version__`` is reported.
2. ``selftest``  the runtime's ``self_test("cuda")`` on the host GPU; skipped (and said so) without a GPU.
3. ``startup``   pid + log + ``/health`` polled ON the host every ~100 ms in one remote call: a dead process or a
                 traceback in the log fails at once, ``/health`` 200 must come within the start-up budget, and a
                 start whose log stays silent while /health fails for ``probe.startup_stall_timeout`` seconds is
                 wedged and fails then (a real model load keeps logging, so it keeps its whole budget). A server we
                 did not start answering on the port is named as such.
4. ``generation`` fixed prompts at temperature 0 must match the recorded baseline token for token; the
                 speculative acceptance length from ``meta_info.spec_accept_length`` is reported.

After the stages the result carries what the user sees of DDTree (``ProbeResult.ddtree``): the active budget (or
schedule), the acceptance length (the probe's replies and the server's own ``avg_spec_accept_length``) and tok/s
(the probe's replies: their output tokens over their wall time), read from SGLang's ``/get_server_info``. SGLang's
``last_gen_throughput`` is kept in the JSON only (``server_last_gen_throughput``): it is the scheduler's last
decode-log interval, idle time counted, so it reads 0.0 or a few tok/s right after the probe's requests.

``check_release`` runs the stages that need no server (1, 2), ``check_serving`` the ones that do (3, 4): the deploy
restarts the server between them. Baselines (what generation compares against) are recorded by ``baseline``.
"""

from __future__ import annotations

import posixpath
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .hoststate import HostLayout
from .ddtree_stats import ddtree_summary
from .errors import ConnectionCut, DeployError, RemoteError, TransportError, is_cut
from .inventory import Host, probe_setting
from .server import ServerControl, base_url, become_prefix, managed_paths, server_kind, server_spec
from .transport import HostConnection

RUNTIME_SUBDIR = "srt/speculative/ddtree"
STAGES = ("overlay", "selftest", "startup", "generation")


@dataclass
class Stage:
    name: str
    status: str  # pass | fail | skip | not-run
    seconds: float = 0.0
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""


@dataclass
class ProbeResult:
    host: str
    release: str | None
    stages: list[Stage]
    label: str = "probe"
    ddtree: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(s.status in ("pass", "skip") for s in self.stages) and any(s.status == "pass" for s in self.stages)

    @property
    def failed_stage(self) -> Stage | None:
        return next((s for s in self.stages if s.status == "fail"), None)

    @property
    def seconds(self) -> float:
        return round(sum(s.seconds for s in self.stages), 3)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "label": self.label, "release": self.release, "ok": self.ok, "seconds": self.seconds,
                "stages": [asdict(s) for s in self.stages], "ddtree": self.ddtree}


def expected_sglang_dir(host: Host, release: str | None) -> str:
    if release is None:
        return posixpath.join(host.site_packages, "sglang")
    return HostLayout.of(host).release_package(release)


def _pid_source(host: Host) -> dict[str, Any]:
    if server_kind(host) == "systemd":
        return {"kind": "systemd", "unit": host.server["unit"], "become": become_prefix(host)}
    return {"kind": "file", "path": managed_paths(host).pid_file}


def _log_source(host: Host) -> dict[str, Any]:
    if server_kind(host) == "systemd":
        return {"kind": "journal", "unit": host.server["unit"], "since": "-15min", "become": become_prefix(host)}
    return {"kind": "file", "path": managed_paths(host).log}


def guard_spec(host: Host) -> dict[str, Any] | None:
    """What the host's guardian needs to put the server back on the last good release by itself and see it come
    up (release.Lease): the server spec plus the start-up check. None for a host whose server we do not drive."""
    if server_kind(host) == "none":
        return None
    return {**server_spec(host), "pid_source": _pid_source(host), "log_source": _log_source(host),
            "health_url": base_url(host) + str(probe_setting(host, "health_path")),
            "startup_timeout": float(probe_setting(host, "startup_timeout")), "stall": float(probe_setting(host, "startup_stall_timeout"))}


class Prober:
    """Runs the stages against one host over an open connection."""

    def __init__(self, conn: HostConnection, *, facts: dict[str, Any] | None = None,
                 progress: Callable[[str], None] | None = None, fence: str | None = None) -> None:
        self.conn = conn
        self.fence = fence  # the run holding the host lock (the log reads of a failed stage pass it on)
        self.host = conn.host
        self.facts = facts
        self.progress = progress or (lambda msg: None)
        self._runtime_present = False
        self._gpu_info: dict[str, Any] | None = None
        self._prefetch = False  # set by run(): the start-up call also runs the generation stage on the host
        self._generation: dict[str, Any] | None = None
        self._info: dict[str, Any] | None = None
        self._info_after: dict[str, Any] | None = None
        self._replies: list[dict[str, Any]] | None = None

    def _call(self, op: str, timeout: float, **args: Any) -> Any:
        try:
            return self.conn.call("probe", op, timeout=timeout + 30, **args)
        except (RemoteError, TransportError) as exc:
            if is_cut(exc):  # the connection died under the call: not a verdict
                raise ConnectionCut(self.host.name, f"connection lost during the probe's {op}") from exc
            raise

    # -- stage 1 -----------------------------------------------------------------------------------------------------
    def overlay(self, release: str | None) -> Stage:
        t0 = time.monotonic()
        budget = float(probe_setting(self.host, "overlay_timeout"))
        try:
            got = self._call("inspect", budget, root=self.host.release_root, env=self.host.server.get("env") or {},
                             runtime_subdir=RUNTIME_SUBDIR, expect=expected_sglang_dir(self.host, release),
                             load=release is not None, budget=budget)
        except DeployError as exc:
            if isinstance(exc, ConnectionCut):
                raise
            return Stage("overlay", "fail", time.monotonic() - t0, str(exc))
        want = expected_sglang_dir(self.host, release)
        got_dir = got.get("sglang_real")
        data = {k: got.get(k) for k in ("executable", "sglang", "sglang_real", "runtime_version", "runtime_file", "pythonpath")}
        seconds = time.monotonic() - t0
        if got_dir is None:
            return Stage("overlay", "fail", seconds, f"the server's Python ({got.get('executable')}) finds no sglang", data)
        if got_dir != got.get("expect_real"):
            return Stage("overlay", "fail", seconds,
                         f"the server's Python resolves sglang to {got_dir}, expected {want} "
                         f"({'release ' + release if release else 'the installed package'})", data)
        if release is None:
            self._runtime_present = False
            return Stage("overlay", "pass", seconds, f"no overlay active: sglang from the installed package {got_dir}", data)
        if not got.get("runtime_present"):
            return Stage("overlay", "fail", seconds, f"release {release} has no DDTree package at {got.get('runtime_dir')}", data)
        if got.get("import_error"):
            return Stage("overlay", "fail", seconds, "loading the DDTree package from the release failed",
                         data, log_tail=got["import_error"])
        version = got.get("runtime_version")
        if not isinstance(version, str) or not version:
            return Stage("overlay", "fail", seconds, f"DDTree package at {got.get('runtime_file')} has no __version__", data)
        self._runtime_present = True
        self._gpu_info = got.get("gpu")
        return Stage("overlay", "pass", seconds, f"sglang from release {release}; DDTree runtime {version}", data)

    # -- stage 2 -----------------------------------------------------------------------------------------------------
    def _gpu(self) -> tuple[bool, str]:
        if self.facts is not None:
            gpus = self.facts.get("gpus")
            if gpus is not None and not gpus:
                return False, "the host's facts list no GPU"
        got = self._gpu_info
        if got is None:
            try:
                got = self.conn.call("probe", "gpu", timeout=60)
            except DeployError as exc:
                if isinstance(exc, ConnectionCut):
                    raise
                return False, f"cannot query nvidia-smi: {exc}"
        return bool(got.get("present")), got.get("why", ", ".join(got.get("gpus", [])))

    def selftest(self, release: str | None) -> Stage:
        t0 = time.monotonic()
        if release is None or not self._runtime_present:
            return Stage("selftest", "skip", 0.0, "no DDTree runtime active")
        present, why = self._gpu()
        if not present:
            return Stage("selftest", "skip", time.monotonic() - t0, f"skipped: no GPU on this host ({why})")
        budget = float(probe_setting(self.host, "selftest_timeout"))
        try:
            got = self._call("selftest", budget, root=self.host.release_root, env=self.host.server.get("env") or {},
                             runtime_subdir=RUNTIME_SUBDIR, budget=budget)
        except DeployError as exc:
            if isinstance(exc, ConnectionCut):
                raise
            return Stage("selftest", "fail", time.monotonic() - t0, str(exc))
        result = got.get("selftest") or {}
        seconds = time.monotonic() - t0
        if got.get("import_error"):
            return Stage("selftest", "fail", seconds, "loading the runtime for the self-test failed", log_tail=got["import_error"])
        if not result.get("ok"):
            bad = [k for k, v in (result.get("checks") or {}).items() if not v]
            return Stage("selftest", "fail", seconds, f"kernel self-test failed on {result.get('device')}: {', '.join(bad) or result.get('error')}",
                         {"selftest": result})
        return Stage("selftest", "pass", seconds, f"kernels agree with references on {result.get('device')} (impl {result.get('impl')})",
                     {"selftest": result})

    # -- stage 3 -----------------------------------------------------------------------------------------------------
    def startup(self, release: str | None) -> Stage:
        t0 = time.monotonic()
        budget = float(probe_setting(self.host, "startup_timeout"))
        url = base_url(self.host) + str(probe_setting(self.host, "health_path"))
        try:
            prompts = list(probe_setting(self.host, "prompts") or [])
            gen_budget = float(probe_setting(self.host, "generation_timeout"))
            then = {"base_url": base_url(self.host), "prompts": prompts, "max_new_tokens": int(probe_setting(self.host, "max_new_tokens")),
                    "budget": gen_budget, "baseline_path": HostLayout.of(self.host).baseline} if prompts and self._prefetch else None
            stall = float(probe_setting(self.host, "startup_stall_timeout"))
            got = self._call("wait_ready", budget + (gen_budget if then else 0.0), pid_source=_pid_source(self.host),
                             log_source=_log_source(self.host), url=url, budget=budget, poll=0.1, then_generate=then,
                             stall=stall if stall < budget else 0.0)
            self._generation = got.get("generation")
            self._info = (got.get("server_info") or {}).get("info")
            self._info_after = (got.get("server_info_after") or {}).get("info")
            if self._generation:  # its time belongs to the generation stage
                t0 += float(self._generation.get("seconds") or 0.0)
        except DeployError as exc:
            if isinstance(exc, ConnectionCut):
                raise
            return Stage("startup", "fail", time.monotonic() - t0, str(exc))
        seconds = time.monotonic() - t0
        state = got["state"]
        data = {k: got.get(k) for k in ("state", "seconds", "pid", "health_status", "health_polls")}
        tail = got.get("log_tail", "")
        if state == "foreign":
            holder = got.get("listener") or {}
            who = f"pid {holder['pid']} ({holder.get('cmdline')})" if holder.get("pid") else "a process we cannot see"
            return Stage("startup", "fail", seconds,
                         f"no server started by ddtree-deploy runs on this host, but {url} answers "
                         f"(HTTP {got.get('health_status') or 'no reply'}) from {who} on port {self.host.server.get('port')}: "
                         "a server the tool did not start; stop it, or `ddtree-deploy server restart` after stopping it",
                         dict(data, listener=holder), tail)
        if state == "dead":
            pid = got.get("pid")
            what = f"the server process (pid {pid}) is not running" if pid else \
                f"the server is not running (no live pid file under {posixpath.dirname(managed_paths(self.host).pid_file)})"
            return Stage("startup", "fail", seconds, f"{what} (seen {got['seconds']:.2f} s into start-up)", data, tail)
        if state == "stalled":
            return Stage("startup", "fail", seconds, f"start-up made no progress: the server log was silent and /health "
                         f"failing for {got.get('silent_for', 0):.0f} s (probe.startup_stall_timeout "
                         f"{probe_setting(self.host, 'startup_stall_timeout'):g} s; last: "
                         f"{got.get('health_status') or got.get('health_error')})", data, tail)
        if state == "traceback":
            return Stage("startup", "fail", seconds, f"a traceback appeared in the server log after {got['seconds']:.2f} s", data, tail)
        if state == "timeout":
            return Stage("startup", "fail", seconds, f"/health did not answer 200 within the start-up budget of {budget:g} s "
                         f"(last: {got.get('health_status') or got.get('health_error')})", data, tail)
        info = (got.get("server_info") or {}).get("info") or {}
        served_by = info.get("pid")
        if isinstance(served_by, int) and got.get("pid") and served_by != got.get("pid"):
            return Stage("startup", "fail", time.monotonic() - t0,
                         f"{url} is answered by another process (pid {served_by}), not by the server we started "
                         f"(pid {got.get('pid')}): is an old server still holding port {self.host.server.get('port')}?",
                         data, self.log_tail())
        runtime_path = info.get("ddtree_runtime_path")
        data["server_runtime_path"] = runtime_path
        if runtime_path and release is not None:
            want = posixpath.join(expected_sglang_dir(self.host, release), RUNTIME_SUBDIR)
            if posixpath.normpath(runtime_path) != posixpath.normpath(want):
                return Stage("startup", "fail", time.monotonic() - t0,
                             f"the running server loaded the DDTree runtime from {runtime_path}, not from release {release}", data)
        return Stage("startup", "pass", time.monotonic() - t0, f"/health 200 after {got['seconds']:.2f} s (pid {got.get('pid')})", data)

    # -- stage 4 -----------------------------------------------------------------------------------------------------
    def generate(self) -> list[dict[str, Any]]:
        prompts = list(probe_setting(self.host, "prompts") or [])
        budget = float(probe_setting(self.host, "generation_timeout"))
        return self._call("generate", budget, url=base_url(self.host), prompts=prompts,
                          max_new_tokens=int(probe_setting(self.host, "max_new_tokens")), budget=budget)

    def generation(self) -> Stage:
        t0 = time.monotonic()
        prompts = list(probe_setting(self.host, "prompts") or [])
        if not prompts:
            return Stage("generation", "skip", 0.0, f"no probe.prompts in {self.host.source}")
        budget = float(probe_setting(self.host, "generation_timeout"))
        prefetched, self._generation = self._generation, None
        if prefetched is not None:  # ran on the host right after start-up, in the start-up stage's round trip
            if not prefetched["ok"]:
                return Stage("generation", "fail", prefetched["seconds"], prefetched["error"])
            got = prefetched["result"]
            t0 = time.monotonic() - prefetched["seconds"]
        else:
            try:
                got = self._call("generate", budget, url=base_url(self.host), prompts=prompts,
                                 max_new_tokens=int(probe_setting(self.host, "max_new_tokens")), budget=budget,
                                 baseline_path=HostLayout.of(self.host).baseline)
            except DeployError as exc:
                if isinstance(exc, ConnectionCut):
                    raise
                return Stage("generation", "fail", time.monotonic() - t0, str(exc))
        baseline, replies = got["baseline"], got["replies"]
        self._replies = replies
        if baseline is None:
            return Stage("generation", "skip", time.monotonic() - t0,
                         f"no baseline recorded at {HostLayout.of(self.host).baseline} (run `ddtree-deploy probe {self.host.name} --record-baseline`)")
        if baseline.get("prompts") != prompts or baseline.get("max_new_tokens") != int(probe_setting(self.host, "max_new_tokens")):
            return Stage("generation", "fail", time.monotonic() - t0,
                         "the recorded baseline was made with other prompts or max_new_tokens than the host file now has; "
                         f"re-record it (`ddtree-deploy probe {self.host.name} --record-baseline`)")
        accept = [r["spec_accept_length"] for r in replies if isinstance(r.get("spec_accept_length"), (int, float))]
        mean_accept = round(sum(accept) / len(accept), 3) if accept else None
        data: dict[str, Any] = {"spec_accept_length": mean_accept, "prompts": len(replies),
                                "per_prompt": [{"prompt": r["prompt"], "tokens": len(r.get("output_ids") or []),
                                                "spec_accept_length": r.get("spec_accept_length"), "seconds": r.get("seconds")}
                                               for r in replies]}
        for got, want in zip(replies, baseline["outputs"], strict=False):
            key = "output_ids" if got.get("output_ids") is not None and want.get("output_ids") is not None else "text"
            a, b = got.get(key), want.get(key)
            if a != b:
                idx = next((i for i, (x, y) in enumerate(zip(a or [], b or [], strict=False)) if x != y), min(len(a or []), len(b or [])))
                return Stage("generation", "fail", time.monotonic() - t0,
                             f"prompt {got['prompt']!r}: output differs from the baseline at {('token' if key == 'output_ids' else 'character')} "
                             f"{idx} (got {_snip(a, idx)}, baseline {_snip(b, idx)})", data)
        min_accept = float(probe_setting(self.host, "min_accept_length"))
        if min_accept and (mean_accept is None or mean_accept < min_accept):
            return Stage("generation", "fail", time.monotonic() - t0,
                         f"speculative acceptance length {mean_accept} below probe.min_accept_length {min_accept}", data)
        acc = f"; spec_accept_length {mean_accept}" if mean_accept is not None else ""
        return Stage("generation", "pass", time.monotonic() - t0, f"{len(replies)} prompts match the baseline token for token{acc}", data)

    # -- all -----------------------------------------------------------------------------------------------------------
    def check_release(self, release: str | None) -> list[Stage]:
        """The stages that need no server (overlay, selftest), stopping at the first failure: a release that cannot
        load is refused before any restart, while the old server keeps serving."""
        return self._stages(STAGES[:2], release, [])

    def check_serving(self, release: str | None, checked: list[Stage] | None = None, *,
                      label: str = "probe") -> ProbeResult:
        """The stages that need the server as it runs now (startup, generation), after ``checked`` (the stages of
        :meth:`check_release`; when one of them failed these are not run). A caller that restarts the server between
        the two has its crash clock start at the real start."""
        self._prefetch, self._generation = True, None
        try:
            stages = self._stages(STAGES[2:], release, list(checked or []))
        finally:
            self._prefetch, self._generation = False, None
        result = ProbeResult(self.host.name, release, stages, label)
        if self._info is not None:
            result.ddtree = ddtree_summary(self._info, self._info_after, self._replies)
        self._info = self._info_after = self._replies = None
        return result

    def run(self, release: str | None, *, label: str = "probe") -> ProbeResult:
        """Every stage in order against the server as it runs, stopping at the first failure."""
        return self.check_serving(release, self.check_release(release), label=label)

    def _stages(self, names: tuple[str, ...], release: str | None, stages: list[Stage]) -> list[Stage]:
        for name in names:
            if any(s.status == "fail" for s in stages):
                stages.append(Stage(name, "not-run", 0.0, "an earlier stage failed"))
                continue
            self.progress(f"{self.host.name}: probe stage {name}")
            with self._waiting(f"{self.host.name}: probe stage {name}"):
                stage = self.generation() if name == "generation" else getattr(self, name)(release)
            stage.seconds = round(stage.seconds, 3)
            stages.append(stage)
            if stage.status == "fail" and not stage.log_tail and name in ("startup", "generation"):
                stage.log_tail = self.log_tail()
        return stages

    def _waiting(self, label: str) -> AbstractContextManager[Any]:
        """The stage as a visible wait when the progress callback offers one (commands/_writes.py: elapsed time and
        the server log's last line, read over a second channel of this connection), else nothing."""
        waiting = getattr(self.progress, "waiting", None)
        return waiting(label, detail=lambda: self.log_tail(1)) if waiting else nullcontext()

    def log_tail(self, lines: int = 40) -> str:
        """The server log's last lines, for a failed stage (empty when they cannot be read)."""
        try:
            return ServerControl(self.conn, self.fence).logs(lines)["text"]
        except DeployError:
            return ""


def _snip(seq: Any, idx: int, width: int = 4) -> str:
    if seq is None:
        return "nothing"
    part = seq[max(0, idx - 1): idx + width]
    return repr(part)
