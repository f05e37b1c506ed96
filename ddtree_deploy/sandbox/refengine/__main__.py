"""``python -m ddtree_refengine``: start the reference engine the way a deployment starts SGLang.

Start-up contract that deployment probes rely on: a pid file while running; one clean start
line in the log when ready; any start-up failure (runtime import, bind, model build, self-test)
prints its traceback to stderr and the log and exits non-zero; SIGTERM/SIGINT exit 0 cleanly.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from . import __version__
from .decode import ALGORITHMS, Engine, SamplingParams
from .models import ModelConfig, build_target
from .runtime_loader import describe, load_runtime
from .server import Batcher, EngineServer
from .tokenizer import encode

log = logging.getLogger("ddtree_refengine")


class _StopRequested(Exception):
    """SIGTERM/SIGINT arrived before the engine was ready: exit cleanly, not as a start-up failure."""


def _close(server: EngineServer | None, serving: bool, pid_file: Path | None) -> None:
    if server is not None:
        if serving:  # shutdown() waits for serve_forever, so only call it once that runs
            server.shutdown()
        server.server_close()
    if pid_file is not None:
        pid_file.unlink(missing_ok=True)


def _hold(text: str) -> int:
    """``--speculative-ddtree-schedule-hold``'s value: decode rounds, an integer >= 0 (argparse names the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of decode rounds (an integer >= 0), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 decode rounds (0 or 1 = no hold), got {value}")
    return value


def resolve_hold(hold: int | None, runtime) -> int:
    """The hold the batcher runs: the flag's, else the runtime's ``schedule.DEFAULT_HOLD`` (0 with a runtime older
    than the hysteresis: it has none to run)."""
    if hold is not None:
        return int(hold)
    try:
        sched_mod = importlib.import_module(runtime.__name__ + ".schedule")
    except ImportError:
        return 0
    return int(getattr(sched_mod, "DEFAULT_HOLD", 0))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddtree_refengine", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (logged)")
    p.add_argument("--speculative-algorithm", type=str.upper, choices=ALGORITHMS, default="NONE",
                   help="NONE (plain decoding); DFLASH: the chain, or DDTree when a budget is given (SGLang's "
                   "spelling with our patch set); DDTREE: DDTree (budget 16 unless given)")
    p.add_argument("--ddtree-budget", "--speculative-ddtree-budget", default=None, dest="budget",
                   help="one budget N, or a batch-size schedule such as 1:64,4:16,8:0 (0 = the chain at that batch "
                   "size; needs a runtime with schedule.py)")
    p.add_argument("--speculative-ddtree-schedule-hold", type=_hold, default=None, dest="hold", metavar="N",
                   help="decode rounds a schedule's new budget must be wanted in a row before a round runs it (the "
                   "SGLang patch set's flag and default, 8; 0 or 1: no hold; prefill steps do not count)")
    p.add_argument("--max-running-requests", type=int, default=8, help="requests decoded together at most")
    p.add_argument("--step-cost-ms", type=float, default=0.0,
                   help="emulated fixed cost of one decoding step of the batch (a GPU reads the weights once per step "
                   "whatever the batch; 0 = off)")
    p.add_argument("--verify-token-cost-us", type=float, default=0.0,
                   help="emulated verify cost: wait this many µs per verified token of the batch each step (a GPU's "
                   "verify is compute-bound at batch > 1; 0 = off)")
    p.add_argument("--block-size", "--speculative-num-draft-tokens", type=int, default=8, dest="block_size")
    p.add_argument("--enable-metrics", action="store_true",
                   help="SGLang's switch for /metrics, accepted as SGLang spells it: the engine always serves "
                   "/metrics (the DDTree families of its runtime's metrics.py)")
    p.add_argument("--seed", type=int, default=0, help="model weights seed")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--load-delay", type=float, default=0.0,
                   help="seconds to wait before building the models, as a large checkpoint would (probe tests)")
    p.add_argument("--log-file", type=Path)
    p.add_argument("--pid-file", type=Path)
    args = p.parse_args(argv)
    if args.speculative_algorithm == "DFLASH" and args.budget is not None:
        args.speculative_algorithm = "DDTREE"  # --speculative-algorithm DFLASH --speculative-ddtree-budget N
        args.spelling = "DFLASH"
    else:
        args.spelling = args.speculative_algorithm
    args.budget = "16" if args.budget is None else str(args.budget).strip()
    if args.budget.isdigit() and int(args.budget) < 1:
        p.error("--ddtree-budget must be >= 1 (a schedule entry may be 0: 1:0 runs the chain)")
    if args.max_running_requests < 1:
        p.error("--max-running-requests must be >= 1")
    if args.block_size < 2:
        p.error("--block-size must be >= 2")
    return args


def resolve_schedule(text: str, runtime) -> tuple[Any, int, str]:
    """(budget_for, max budget, canonical text) of the budget flag. One number needs nothing from the runtime; a
    schedule is parsed by the runtime's own ``schedule.py`` (a runtime without it cannot take one: start-up error)."""
    if text.isdigit():
        budget = int(text)
        return (lambda bs: budget), budget, str(budget)
    try:
        sched_mod = importlib.import_module(runtime.__name__ + ".schedule")
    except ImportError:
        raise RuntimeError(f"--speculative-ddtree-budget {text}: the DDTree runtime at {runtime.__file__} has no "
                           "schedule.py, so it takes one budget N only") from None
    schedule = sched_mod.parse_schedule(text, source="--speculative-ddtree-budget")
    return schedule.budget_for, schedule.max_budget, str(schedule)


def _setup_logging(log_file: Path | None) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    for h in handlers:
        h.setFormatter(fmt)
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _setup_logging(args.log_file)
    torch.set_num_threads(max(1, args.threads))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server: EngineServer | None = None
    serving = False
    try:
        if args.pid_file is not None:
            args.pid_file.parent.mkdir(parents=True, exist_ok=True)
            args.pid_file.write_text(f"{os.getpid()}\n")
        runtime = load_runtime() if args.speculative_algorithm != "NONE" else None
        rt_info = describe(runtime) if runtime is not None else {"path": None, "version": None}
        hold = 0
        if args.speculative_algorithm == "DDTREE":
            budget_for, max_budget, budget_text = resolve_schedule(args.budget, runtime)
            hold = resolve_hold(args.hold, runtime)
        else:
            budget_for, max_budget, budget_text = (lambda bs: 1), 1, None
        cfg = ModelConfig(seed=args.seed)
        info = {
            "version": __version__,
            "engine": "ddtree_refengine",
            "model_path": f"ddtree-refengine-tiny-seed{args.seed}",
            "speculative_algorithm": None if args.speculative_algorithm == "NONE" else args.spelling,
            "speculative_ddtree_budget": (int(budget_text) if budget_text.isdigit() else budget_text)
            if budget_text is not None else None,
            "speculative_ddtree_schedule_hold": hold if budget_text is not None else None,
            "max_running_requests": args.max_running_requests,
            "step_cost_ms": args.step_cost_ms,
            "verify_token_cost_us": args.verify_token_cost_us,
            "speculative_block_size": args.block_size,
            "speculative_num_draft_tokens": args.block_size if args.speculative_algorithm != "NONE" else None,
            "ddtree_runtime_path": rt_info["path"],
            "ddtree_runtime_version": rt_info["version"],
            "model_seed": args.seed,
            "vocab_size": cfg.vocab_size,
            "python": sys.executable,
            "pid": os.getpid(),
        }
        server = EngineServer((args.host, args.port), info)
        host, port = server.server_address[:2]
        log.info("listening on http://%s:%d (loading)", host, port)
        threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
        serving = True
        if stop.wait(max(0.0, args.load_delay)):
            raise _StopRequested
        engine = Engine(build_target(cfg), args.speculative_algorithm, runtime, max(1, budget_for(1)),
                        args.block_size, max_budget=max_budget)
        engine.generate(encode("self-test"), SamplingParams(max_new_tokens=8, temperature=0.0))
        if engine.stats is not None:
            engine.stats = type(engine.stats)(engine.stats.depths)  # the self-test is not served traffic
        server.set_ready(engine, Batcher(engine, budget_for, args.max_running_requests, args.verify_token_cost_us,
                                         args.step_cost_ms, hold=hold))
    except _StopRequested:
        log.info("stopped while loading")
        _close(server, serving, args.pid_file)
        return 0
    except Exception:
        log.exception("ddtree_refengine failed to start")
        _close(server, serving, args.pid_file)
        return 1
    log.info(
        "ddtree_refengine %s ready on http://%s:%d algorithm=%s budget=%s block_size=%d seed=%d "
        "runtime=%s runtime_version=%s pid=%d",
        __version__, host, port, args.speculative_algorithm, budget_text or args.budget, args.block_size, args.seed,
        rt_info["path"], rt_info["version"], os.getpid(),
    )
    log.info("The server is fired up and ready to roll!")
    while not stop.wait(0.5):
        pass
    log.info("shutting down (signal received)")
    _close(server, True, args.pid_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
