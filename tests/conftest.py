"""Shared fixtures: real sshd sandbox hosts, made once per test session in a temporary directory.

The sandbox is the same code `ddtree-deploy sandbox up` runs (real sshd on loopback, one mount namespace per host,
real SGLang wheels). Tests that need it take the ``sandbox`` fixture; without root or sshd they are skipped
locally, but under CI (CI=true) a missing prerequisite is an error, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddtree_deploy.inventory import Host, load_inventory
from ddtree_deploy.sandbox import DEFAULT_HOSTS, SSHD, Sandbox, SandboxState

REPO = Path(__file__).resolve().parent.parent


@dataclass
class SandboxEnv:
    """A running sandbox: its state, its inventory directory, and the validated hosts."""

    box: Sandbox
    state: SandboxState
    inventory: Path

    @property
    def hosts(self) -> dict[str, Host]:
        return load_inventory(self.inventory)

    @property
    def base(self) -> Host:
        return self.hosts[DEFAULT_HOSTS[0][0]]

    @property
    def drift(self) -> Host:
        return self.hosts[DEFAULT_HOSTS[1][0]]


def _sandbox_possible() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not Path(SSHD).exists():
        return f"{SSHD} missing (apt-get install openssh-server)"
    if not shutil.which("unshare"):
        return "unshare missing"
    return None


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> SandboxEnv:
    problem = _sandbox_possible()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"sandbox hosts cannot start in CI: {problem}")
        pytest.skip(f"sandbox hosts unavailable: {problem}")
    root = tmp_path_factory.mktemp("sandbox")
    inventory = root / "hosts"
    box = Sandbox(root / "state", inventory)
    state = box.up(DEFAULT_HOSTS)
    env = SandboxEnv(box=box, state=state, inventory=inventory)
    yield env
    box.down()
