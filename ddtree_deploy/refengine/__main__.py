"""``python -m ddtree_refengine``: start the reference engine the way a deployment starts SGLang.

Start-up contract that deployment probes rely on: a pid file while running; one clean start
line in the log when ready; any start-up failure (runtime import, bind, model build, self-test)
prints its traceback to stderr and the log and exits non-zero; SIGTERM/SIGINT exit 0 cleanly.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Sequence

import torch

from . import __version__
from .decode import ALGORITHMS, Engine, SamplingParams
from .models import ModelConfig, build_target
from .runtime_loader import describe, load_runtime
from .server import EngineServer
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddtree_refengine", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (logged)")
    p.add_argument("--speculative-algorithm", type=str.upper, choices=ALGORITHMS, default="NONE")
    p.add_argument("--ddtree-budget", "--speculative-ddtree-budget", type=int, default=16, dest="budget")
    p.add_argument("--block-size", "--speculative-num-draft-tokens", type=int, default=8, dest="block_size")
    p.add_argument("--seed", type=int, default=0, help="model weights seed")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--load-delay", type=float, default=0.0,
                   help="seconds to wait before building the models, as a large checkpoint would (probe tests)")
    p.add_argument("--log-file", type=Path)
    p.add_argument("--pid-file", type=Path)
    args = p.parse_args(argv)
    if args.budget < 1:
        p.error("--ddtree-budget must be >= 1")
    if args.block_size < 2:
        p.error("--block-size must be >= 2")
    return args


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
        cfg = ModelConfig(seed=args.seed)
        info = {
            "version": __version__,
            "engine": "ddtree_refengine",
            "model_path": f"ddtree-refengine-tiny-seed{args.seed}",
            "speculative_algorithm": None if args.speculative_algorithm == "NONE" else args.speculative_algorithm,
            "speculative_ddtree_budget": args.budget if args.speculative_algorithm == "DDTREE" else None,
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
        engine = Engine(build_target(cfg), args.speculative_algorithm, runtime, args.budget, args.block_size)
        engine.generate(encode("self-test"), SamplingParams(max_new_tokens=8, temperature=0.0))
        server.set_ready(engine)
    except _StopRequested:
        log.info("stopped while loading")
        _close(server, serving, args.pid_file)
        return 0
    except Exception:
        log.exception("ddtree_refengine failed to start")
        _close(server, serving, args.pid_file)
        return 1
    log.info(
        "ddtree_refengine %s ready on http://%s:%d algorithm=%s budget=%d block_size=%d seed=%d "
        "runtime=%s runtime_version=%s pid=%d",
        __version__, host, port, args.speculative_algorithm, args.budget, args.block_size, args.seed,
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
