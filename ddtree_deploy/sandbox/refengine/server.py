"""HTTP front end with SGLang's endpoint shapes (/health, /get_server_info, /generate), and a small scheduler.

Why SGLang's shapes: the deployment probe, ``bench`` and ``tune`` are written once, against SGLang; on a GPU-less
host they talk to this server instead and must not need to know. Stdlib only (ThreadingHTTPServer). Requests
that arrive together decode together, like SGLang's continuous batching: up to ``max_running_requests`` run, and
each decode step advances every running request by one round at the budget the DDTree schedule gives for the size
of that decode batch (so a schedule such as ``1:64,4:16,8:0`` really changes the verify width with the load), a change
held as the SGLang patch set holds it (``--speculative-ddtree-schedule-hold``, the runtime's ``schedule.Hysteresis``);
arrivals are prefilled in steps of their own, as SGLang's scheduler does.
"""

from __future__ import annotations

import importlib
import json
import logging
import secrets
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import tokenizer
from .decode import Engine, GenerationResult, Request, SamplingParams

log = logging.getLogger("ddtree_refengine")

MAX_NEW_TOKENS_CAP = 4096
MAX_PROMPT_TOKENS = 8192
MAX_BODY_BYTES = 1 << 20


class BadRequest(ValueError):
    """A client error: answered with HTTP 400 and the message, never a traceback."""


def runtime_part(engine: Engine | None, name: str) -> Any:
    """A module of the engine's DDTree runtime (``schedule``, ``metrics``), or None (plain decoding, or a runtime
    older than that module)."""
    rt = getattr(engine, "runtime", None)
    if rt is None:
        return None
    try:
        return importlib.import_module(f"{rt.__name__}.{name}")
    except ImportError:
        return None


def parse_generate(body: dict[str, Any], schedule: Any = None) -> tuple[list[int], SamplingParams, int]:
    """Validate a /generate body; returns (input_ids, sampling params, seed). ``schedule``: the runtime's schedule
    module, which reads a request's own budget (``sampling_params.custom_params.ddtree``, as SGLang carries it);
    without it (plain decoding) the key is ignored, as SGLang without DDTree ignores it."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("give exactly one of 'text' or 'input_ids'")
    if text is not None:
        if not isinstance(text, str):
            raise BadRequest("'text' must be a string (batched requests are not supported)")
        input_ids = tokenizer.encode(text)
    else:
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BadRequest("'input_ids' must be a non-empty list of integers (batched requests are not supported)")
        if any(not 0 <= i < tokenizer.VOCAB_SIZE for i in ids):
            raise BadRequest(f"'input_ids' must lie in [0, {tokenizer.VOCAB_SIZE})")
        input_ids = list(ids)
    if len(input_ids) > MAX_PROMPT_TOKENS:
        raise BadRequest(f"prompt longer than {MAX_PROMPT_TOKENS} tokens")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise BadRequest("'sampling_params' must be an object")
    try:
        max_new = int(sp.get("max_new_tokens", 128))
        temperature = float(sp.get("temperature", 1.0))
        stops = [int(s) for s in (sp.get("stop_token_ids") or [])]
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling_params: {exc}") from None
    if not 1 <= max_new <= MAX_NEW_TOKENS_CAP:
        raise BadRequest(f"max_new_tokens must lie in [1, {MAX_NEW_TOKENS_CAP}]")
    if temperature < 0:
        raise BadRequest("temperature must be >= 0")
    if not sp.get("ignore_eos", False):
        stops.append(tokenizer.EOS_ID)
    seed = body.get("seed", sp.get("sampling_seed"))
    if seed is None:
        seed = secrets.randbits(63)
    elif not isinstance(seed, int) or isinstance(seed, bool):
        raise BadRequest("'seed' must be an integer")
    budget = None
    if schedule is not None and hasattr(schedule, "request_budget"):
        try:
            budget = schedule.request_budget(sp.get("custom_params"), source="sampling_params.custom_params")
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    return input_ids, SamplingParams(max_new, temperature, tuple(dict.fromkeys(stops)), budget), seed


@dataclass
class _Job:
    input_ids: list[int]
    params: SamplingParams
    seed: int
    done: threading.Event = field(default_factory=threading.Event)
    req: Request | None = None
    error: BaseException | None = None


class Batcher:
    """Continuous batching in miniature, stepped as SGLang's scheduler steps. A step either prefills the requests
    that arrived (up to ``max_running`` running; one prefill step for all of them, no decode round in it), or, when
    none are waiting, is a decode round: every running request advances one round at the budget for the decode
    batch's size, ``budget_for(bs)`` (0 = the chain round), through the runtime's ``schedule.Hysteresis`` when a
    ``hold`` > 1 is given (a change of budget waits until the decode batch has wanted it ``hold`` rounds in a row;
    prefill steps are not rounds: they neither count nor reset it). A decode round then waits the emulated GPU cost
    when it is set: ``step_cost_ms`` once (reading the weights, whatever the batch) plus ``verify_token_cost_us``
    per verified token of the batch (the verify forward is compute-bound once a batch is large). Without it a CPU
    round costs what the tiny models cost, which grows with the batch but hardly with the width. One thread decodes
    (``start=False``: none; the caller drives :meth:`step`)."""

    def __init__(self, engine: Engine, budget_for: Any, max_running: int = 8, verify_token_cost_us: float = 0.0,
                 step_cost_ms: float = 0.0, *, hold: int = 0, start: bool = True) -> None:
        self.engine = engine
        self.budget_for = budget_for
        self.max_running = max(1, int(max_running))
        self.cost_us = float(verify_token_cost_us)
        self.step_ms = float(step_cost_ms)
        self.cv = threading.Condition()
        self.waiting: deque[_Job] = deque()
        self.running: list[_Job] = []
        self.steps = 0  # decode rounds
        self.prefill_steps = 0
        schedule = runtime_part(engine, "schedule")
        self.hysteresis = None
        if int(hold) > 1 and engine.algorithm != "NONE":
            if schedule is None or not hasattr(schedule, "Hysteresis"):
                raise RuntimeError(f"--speculative-ddtree-schedule-hold {hold}: the DDTree runtime at "
                                   f"{getattr(engine.runtime, '__file__', '?')} has no schedule.Hysteresis (give 0)")
            self.hysteresis = schedule.Hysteresis(int(hold))
        metrics = runtime_part(engine, "metrics")
        # the server-wide counters /metrics shows (the runtime's metrics.Totals), under their own lock
        self.totals = metrics.Totals() if metrics is not None else None
        self.totals_lock = threading.Lock()
        if start:
            threading.Thread(target=self._loop, name="batcher", daemon=True).start()

    def enqueue(self, input_ids: list[int], params: SamplingParams, seed: int) -> _Job:
        """Queue a request; its job's ``done`` is set once it finished (``req.result``) or failed (``error``)."""
        job = _Job(input_ids, params, seed)
        with self.cv:
            self.waiting.append(job)
            self.cv.notify()
        return job

    def submit(self, input_ids: list[int], params: SamplingParams, seed: int) -> GenerationResult:
        job = self.enqueue(input_ids, params, seed)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.req.result

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.waiting and not self.running:
                    self.cv.wait()
            self.step()

    def step(self) -> str | None:
        """One scheduler step: "prefill" (the waiting requests that fit were prefilled), "decode" (one round of
        every running request), or None (nothing to do)."""
        with self.cv:
            fresh = []
            while self.waiting and len(self.running) + len(fresh) < self.max_running:
                fresh.append(self.waiting.popleft())
        if fresh:
            for job in fresh:
                try:
                    job.req = self.engine.start(job.input_ids, job.params, seed=job.seed)
                except BaseException as exc:  # a bad request fails alone
                    job.error = exc
                    job.done.set()
                    continue
                self.running.append(job)
            self.prefill_steps += 1
            kind: str | None = "prefill"
        else:
            live = [j for j in self.running if not j.req.done]
            kind = "decode" if live else None
            if live:
                self._decode(live)
        for job in [j for j in self.running if j.error is not None or j.req.done]:
            self.running.remove(job)
            job.done.set()
        return kind

    def _decode(self, live: list[_Job]) -> None:
        bs = len(live)
        budget = None
        if self.engine.algorithm != "NONE":
            budget = self.budget_for(bs)
            if self.hysteresis is not None:
                budget = self.hysteresis.step(budget)
        t0 = time.perf_counter()
        entries = []
        for job in live:
            try:
                before = job.req.result.verify_rounds
                self.engine.step(job.req, budget)
                if job.req.result.verify_rounds > before:
                    entries.append(job.req.result.round_entries[-1])
            except BaseException as exc:
                log.exception("decoding step failed")
                job.error = exc
        width = self.engine.round_width(budget)
        wait = self.step_ms / 1e3 + self.cost_us * bs * width / 1e6
        if wait > 0:
            time.sleep(wait)
        self.steps += 1
        if self.totals is not None and entries:
            with self.totals_lock:
                self.totals.add_round(width, self.engine.algorithm == "DFLASH" or budget == 0, entries)
                self.totals.observe_round(width, time.perf_counter() - t0)


class EngineServer(ThreadingHTTPServer):
    """Serves 503 on /health until ``set_ready`` installs the engine (models build after binding)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], info: dict[str, Any]) -> None:
        super().__init__(address, _Handler)
        self.info = info
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None
        self.metrics: Any = None  # the runtime's metrics and schedule modules (set_ready)
        self.schedule: Any = None
        self.lock = threading.Lock()  # the counters below
        # the counters SGLang's scheduler keeps for /get_server_info's internal_states
        self.spec_accept_tokens = 0
        self.spec_forward_ct = 0
        self.last_gen_throughput = 0.0

    def server_info(self) -> dict[str, Any]:
        """SGLang's shape: the server arguments at the top level, the scheduler's counters per DP rank in
        ``internal_states`` (``avg_spec_accept_length`` only once a speculative round ran, as SGLang does)."""
        state: dict[str, Any] = {k: self.info.get(k) for k in ("speculative_algorithm", "speculative_ddtree_budget",
                                                              "speculative_num_draft_tokens")}
        state["last_gen_throughput"] = self.last_gen_throughput
        if self.info.get("speculative_algorithm") and self.spec_forward_ct:
            state["avg_spec_accept_length"] = self.spec_accept_tokens / self.spec_forward_ct
        if self.engine is not None and self.engine.stats is not None:
            state["spec_accept_stats"] = self.engine.stats.to_dict()
        return {**self.info, "ready": self.engine is not None, "internal_states": [state]}

    def set_ready(self, engine: Engine, batcher: Batcher | None = None) -> None:
        self.batcher = batcher or Batcher(engine, lambda bs: engine.budget)
        self.metrics = runtime_part(engine, "metrics")
        self.schedule = runtime_part(engine, "schedule")
        self.engine = engine

    def metrics_text(self) -> str:
        """``/metrics``: the runtime's DDTree families (its ``metrics.FAMILIES``), as the patch set adds them to
        SGLang's, with the per-(depth, rank) counts from the engine's acceptance counters (every rank is observed
        where a path reached a depth: the engine ranks the target's token among all the drafter's candidates)."""
        if self.metrics is None or self.batcher is None or self.batcher.totals is None:
            return ""
        with self.batcher.totals_lock:
            stats = self.engine.stats
            if stats is not None:
                self.batcher.totals.set_ranks([[n] * stats.ranks for n in stats.reached], stats.hits)
            samples = self.batcher.totals.samples()
        return self.metrics.render(samples, {"model_name": str(self.info.get("model_path"))})

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        input_ids, params, seed = parse_generate(body, self.schedule)
        if self.engine is None:
            raise RuntimeError("engine not ready")
        res = self.batcher.submit(input_ids, params, seed)
        with self.lock:
            if res.verify_rounds:
                self.spec_accept_tokens += sum(res.round_commits)
                self.spec_forward_ct += res.verify_rounds
            if res.seconds > 0:
                self.last_gen_throughput = len(res.output_ids) / res.seconds
        log.info(
            "generate: prompt=%d completion=%d accept_length=%.2f verify_ct=%d finish=%s %.3fs",
            res.prompt_tokens, len(res.output_ids), res.accept_length, res.verify_rounds,
            res.finish_reason.get("type"), res.seconds,
        )
        return {
            "text": tokenizer.decode(res.output_ids),
            "output_ids": res.output_ids,
            "meta_info": {
                "id": uuid.uuid4().hex,
                "prompt_tokens": res.prompt_tokens,
                "completion_tokens": len(res.output_ids),
                "spec_accept_length": res.accept_length,
                "spec_verify_ct": res.verify_rounds,
                "finish_reason": res.finish_reason,
                "e2e_latency": res.seconds,
                **(self.metrics.request_summary(res.round_entries, self.engine.block_size - 1)
                   if self.metrics is not None else {}),
            },
        }


class _Handler(BaseHTTPRequestHandler):
    server: EngineServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: Any | None = None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self._send(200 if self.server.engine is not None else 503)
        elif path in ("/get_server_info", "/server_info"):
            self._send(200, self.server.server_info())
        elif path == "/get_model_info":
            self._send(200, {"model_path": self.server.info.get("model_path"), "is_generation": True})
        elif path == "/metrics":
            self._send_text(200, self.server.metrics_text() if self.server.engine is not None else "")
        else:
            self._send(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        if path != "/generate":
            self._send(404, {"error": {"message": f"no route {path}"}})
            return
        if self.server.engine is None:
            self._send(503, {"error": {"message": "server is still loading"}})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                raise BadRequest(f"body must be 1..{MAX_BODY_BYTES} bytes of JSON")
            try:
                body = json.loads(self.rfile.read(length))
            except json.JSONDecodeError as exc:
                raise BadRequest(f"invalid JSON: {exc}") from None
            t0 = time.perf_counter()
            payload = self.server.generate(body)
            payload["meta_info"]["e2e_latency"] = time.perf_counter() - t0
            self._send(200, payload)
        except BadRequest as exc:
            self._send(400, {"error": {"message": str(exc)}})
        except Exception as exc:  # a decoding failure is a server error, logged with its traceback
            log.exception("generate failed")
            self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
