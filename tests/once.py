"""Session-wide artefacts built once per test run, even when pytest-xdist runs the suite in several workers.

Patched SGLang trees (one per base) and the project's wheel in a fresh venv take seconds to a minute each; every
xdist worker is its own session, so without this each worker would build its own copy. The first worker that
needs one builds it under a lock in the run's shared temporary directory; the others wait and reuse it. Within one
run only (the directory is the run's own), so nothing stale survives into the next run.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of the whole run: under xdist the parent of this worker's base, else the base."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(dest)`` for ``dest = <run dir>/shared/<name>`` unless another worker of this run already did; the
    path either way. A build that raised (or skipped) leaves no mark, so the next worker that needs it tries again."""
    shared = run_dir(tmp_path_factory) / "shared"
    shared.mkdir(exist_ok=True)
    dest, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if dest.exists():
                shutil.rmtree(dest)  # what a failed build left
            build(dest)
            done.touch()
    return dest
