"""Helpers for the reference-engine tests: the package under its deployed name, server processes.

The engine ships to sandbox hosts as the top-level package ``ddtree_refengine``; tests import it under
that name (from ddtree_deploy/sandbox/refengine, by path) so they exercise exactly what is deployed. Server
tests go further and run a *copy* of the package from a scratch site dir with the repo off the path.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG_DIR = REPO / "ddtree_deploy" / "sandbox" / "refengine"
RUNTIME_DIR = Path(os.environ.get("DDTREE_RUNTIME_PATH") or REPO / "patches" / "ddtree" / "runtime").resolve()


def _register_package() -> None:
    if "ddtree_refengine" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "ddtree_refengine", PKG_DIR / "__init__.py", submodule_search_locations=[str(PKG_DIR)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["ddtree_refengine"] = module
    spec.loader.exec_module(module)


_register_package()


@dataclass
class ServerProc:
    proc: subprocess.Popen
    log_file: Path
    pid_file: Path
    port: int | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=timeout)


READY_RE = re.compile(r"ready on http://127\.0\.0\.1:(\d+)")


LISTENING_RE = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def start_server(site: Path, workdir: Path, args: list[str], env_extra: dict[str, str],
                 deadline_s: float = 60.0, wait_for: re.Pattern = READY_RE) -> ServerProc:
    """Start ``python -m ddtree_refengine`` from ``site`` (repo not importable); wait for ``wait_for`` or exit."""
    log_file, pid_file = workdir / "server.log", workdir / "server.pid"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDTREE_RUNTIME_PATH")}
    env.update({"PYTHONPATH": str(site), **env_extra})
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddtree_refengine", "--host", "127.0.0.1", "--port", "0",
         "--log-file", str(log_file), "--pid-file", str(pid_file), *args],
        cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            return ServerProc(proc, log_file, pid_file, None)
        match = wait_for.search(log_file.read_text()) if log_file.exists() else None
        if match:
            return ServerProc(proc, log_file, pid_file, int(match.group(1)))
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"server neither became ready nor exited within {deadline_s}s")
