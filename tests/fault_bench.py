"""The fault-injection bench the two short-form fault files share (tests/test_faults.py: the transaction under cuts,
signals and a killed guardian; tests/test_faults_host.py: what the host does to a deploy). One file each, so the two
halves run on different test workers; each builds the bench once (``bench_on``), on its worker's sandbox host."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from faults import FaultBench, Trial  # noqa: E402


def bench_on(sandbox, tmp_path_factory) -> Iterator[FaultBench]:
    """The body of each file's module-scoped ``bench`` fixture: the bench set up on the worker's sandbox base host,
    its full-disk mount and the rest taken down after the module."""
    sbox = sandbox.state.hosts[sandbox.base.name]
    b = FaultBench(sbox, sandbox.base, tmp_path_factory.mktemp("faults"), log=lambda m: None, engine="standin",
                   box=sandbox.box)
    b.setup()
    yield b
    b.teardown_disk()
    b.teardown()


def held(trial: Trial) -> None:
    """The trial's transaction held (see tests/test_faults.py); else the whole trial, as JSON."""
    assert trial.held, json.dumps(dataclasses.asdict(trial), indent=1, default=str)[:6000]
