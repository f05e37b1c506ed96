"""`make demo` runs end to end: the whole flow on its own sandbox hosts, with every step's expected exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.sandbox import _alive

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


def test_demo_runs_the_whole_flow_and_leaves_nothing_running(sandbox, tmp_path: Path) -> None:
    # the `sandbox` fixture only guarantees the prerequisites (root, sshd); the demo makes and removes its own hosts
    env = {**os.environ, "DDTREE_SANDBOX_DIR": str(tmp_path / "sandbox"), "DDTREE_INVENTORY": str(tmp_path / "hosts"),
           "DDTREE_SNAPSHOTS": str(tmp_path / "snapshots"), "COLUMNS": "200"}
    env.pop("DEMO_KEEP", None)
    proc = subprocess.run([sys.executable, "-m", "ddtree_deploy.sandbox.demo"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    summary = log[log.index("demo summary"):]
    assert summary.count(" ok ") >= 10 and "FAILED" not in summary
    # the good apply showed an acceptance length; the broken overlay was rolled back
    assert "spec_accept_length" in log
    assert "rolled back to release" in log
    # nothing of the demo is left: no sandbox files, no host YAMLs, no sshd or server in the demo's namespaces
    assert not (tmp_path / "sandbox").exists()
    assert not list((tmp_path / "hosts").glob("*.yaml"))
    leftovers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(tmp_path) in cmdline:
                leftovers.append(cmdline)
    assert not leftovers, leftovers
