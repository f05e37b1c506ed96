"""`sandbox up` is idempotent and `sandbox down` removes everything it made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.sandbox import Sandbox, _alive

pytestmark = pytest.mark.sandbox


def test_up_twice_is_idempotent(sandbox) -> None:
    before = {name: (h.ssh_port, h.pid) for name, h in sandbox.box.load_state().hosts.items()}
    inventory_before = {p.name: p.read_text() for p in sandbox.inventory.glob("*.yaml")}
    state = sandbox.box.up(tuple((h.name, h.sglang) for h in sandbox.state.hosts.values()))
    after = {name: (h.ssh_port, h.pid) for name, h in state.hosts.items()}
    assert after == before
    assert {p.name: p.read_text() for p in sandbox.inventory.glob("*.yaml")} == inventory_before
    assert all(row["running"] for row in sandbox.box.status())


def test_down_removes_everything_it_made(sandbox, tmp_path: Path) -> None:
    root, inv = tmp_path / "box", tmp_path / "inv"
    inv.mkdir()
    (inv / "mine.yaml").write_text("# not the sandbox's\n")
    env = {**os.environ, "DDTREE_SANDBOX_DIR": str(root), "DDTREE_INVENTORY": str(inv)}
    up = subprocess.run([sys.executable, "-m", "ddtree_deploy", "sandbox", "up"], env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    state = Sandbox(root, inv).load_state()
    pids = [h.pid for h in state.hosts.values()]
    assert pids and all(_alive(p) for p in pids)
    # a process started over SSH on the host (like a server) must go down with it
    host_yaml = inv / "sandbox-base.yaml"
    assert host_yaml.exists()
    from ddtree_deploy.inventory import load_host_file
    from ddtree_deploy.transport import HostConnection

    with HostConnection(load_host_file(host_yaml)) as conn:
        child = int(conn.run("setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!").text())
    assert _alive(child)
    down = subprocess.run([sys.executable, "-m", "ddtree_deploy", "sandbox", "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not root.exists()
    assert sorted(p.name for p in inv.iterdir()) == ["mine.yaml"]
    assert not any(_alive(p) for p in pids + [child])
