"""A small stand-in for an SGLang server, for deploy tests: SGLang's endpoint shapes, scripted failures.

Stdlib only; copied onto sandbox hosts and started as the host's server command. Its behaviour comes from the
release it runs from, so a "bad release" really is bad and rolling back really fixes it: the mode is read from
``<sglang package>/standin_mode`` (found with find_spec, like the real runtime loader) or from ``standin_mode``
in the release's DDTree runtime directory (so a patch set's vendored runtime can carry it), overridden by the
``STANDIN_MODE`` environment variable. Modes:

  ok            /health 200 after ``--ready-after`` seconds; /generate answers deterministically from the prompt
  crash         logs a traceback and exits 1 after ``--crash-after`` seconds (default 0.3)
  exit          exits 3 silently after ``--crash-after`` seconds (a death without a traceback)
  hang          binds the port but /health answers 503 forever
  traceback     like hang, and logs a traceback line by line, 0.1 s apart (a crashed worker behind a live front end)
  wrong-output  like ok, but the last generated token is changed
  wedge         logs its start line, then nothing: no port, no /health (a start that is stuck)
  slowload      logs "loading shard i/N" every 0.3 s for ``--load-seconds`` (default 3), then serves like ok: a
                long start that keeps making progress

Every exit writes ``standin: exit at <epoch seconds>`` to stderr so benchmarks can time detection from the exit.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _mode_and_runtime():
    spec = importlib.util.find_spec("sglang")
    pkg = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
    mode = "ok"
    runtime = None
    if pkg:
        try:
            with open(os.path.join(pkg, "standin_mode")) as fh:
                mode = fh.read().strip() or "ok"
        except OSError:
            pass
        rdir = os.path.join(pkg, "srt", "speculative", "ddtree")
        if os.path.isfile(os.path.join(rdir, "__init__.py")):
            runtime = os.path.realpath(rdir)
            try:
                with open(os.path.join(rdir, "standin_mode")) as fh:
                    mode = fh.read().strip() or mode
            except OSError:
                pass
    return os.environ.get("STANDIN_MODE", mode), runtime


def _tokens(prompt, n):
    out = []
    seed = prompt.encode()
    while len(out) < n:
        seed = hashlib.sha256(seed).digest()
        out.extend(b % 200 for b in seed)
    return out[:n]


def _exit(code):
    sys.stderr.write("standin: exit at %.6f\n" % time.time())
    sys.stderr.flush()
    os._exit(code)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculative-algorithm", default="NONE")
    p.add_argument("--ddtree-budget", type=int, default=16)
    p.add_argument("--ready-after", type=float, default=0.2)
    p.add_argument("--crash-after", type=float, default=0.3)
    p.add_argument("--load-seconds", type=float, default=3.0)
    args, _ = p.parse_known_args()
    mode, runtime = _mode_and_runtime()
    spec_on = args.speculative_algorithm.upper() != "NONE"
    sys.stderr.write("standin: pid %d mode %s speculative %s runtime %s\n" % (os.getpid(), mode, spec_on, runtime))
    sys.stderr.flush()
    if mode in ("crash", "exit"):
        time.sleep(args.crash_after)
        if mode == "crash":
            try:
                raise RuntimeError("standin: scripted start-up crash")
            except RuntimeError:
                traceback.print_exc()
            _exit(1)
        _exit(3)
    if mode == "wedge":
        while True:
            time.sleep(3600)
    if mode == "slowload":
        shards = max(1, int(args.load_seconds / 0.3))
        for i in range(shards):
            sys.stderr.write("standin: loading shard %d/%d\n" % (i + 1, shards))
            sys.stderr.flush()
            time.sleep(0.3)
    if mode == "traceback":
        time.sleep(args.crash_after)
        try:
            raise RuntimeError("standin: scripted worker crash")
        except RuntimeError:
            # line by line with a pause, as a front end relaying a worker's output writes it: the probe must not
            # cut the log tail between the "Traceback" line and the exception line that names the error
            for line in traceback.format_exc().splitlines(True):
                sys.stderr.write(line)
                sys.stderr.flush()
                time.sleep(0.1)
    started = time.time()
    info = {"engine": "standin", "pid": os.getpid(), "speculative_algorithm": args.speculative_algorithm if spec_on else None,
            "ddtree_runtime_path": runtime if spec_on else None}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, payload=None):
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            ready = mode not in ("hang", "traceback") and time.time() - started >= args.ready_after
            if self.path.startswith("/health"):
                self._send(200 if ready else 503)
            elif self.path.startswith("/get_server_info"):
                self._send(200, info)
            else:
                self._send(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            n = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
            ids = _tokens(body.get("text", ""), n)
            if mode == "wrong-output":
                ids[-1] = (ids[-1] + 1) % 200
            self._send(200, {"text": " ".join(map(str, ids)), "output_ids": ids,
                             "meta_info": {"completion_tokens": n, "spec_accept_length": 3.25 if spec_on else 1.0}})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    sys.stderr.write("standin: listening on %s:%d\n" % (args.host, args.port))
    sys.stderr.flush()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: _exit(0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
