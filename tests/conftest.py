"""Shared fixtures: real sshd sandbox hosts, made once per test session in a temporary directory.

The sandbox is the same code `ddtree-deploy sandbox up` runs (real sshd on loopback, one mount namespace per host,
real SGLang wheels). Tests that need it take the ``sandbox`` fixture.

Two rules for the whole suite live here as well:

- Markers by what a test costs: a test whose fixtures start sandbox hosts is marked ``sandbox``, one that unpacks,
  patches or installs real SGLang wheels (or the project's own wheel) ``wheels``, whether or not its module says
  so, so ``make test-fast`` (``-m "not gpu and not sandbox and not wheels and not slow"``) is a true inner loop.
- No silent skips: a test that skips fails the run, unless its skip is on ``ALLOWED_SKIPS`` below (each entry says
  why it cannot run everywhere). A machine that lacks what the suite needs (root, sshd, the wheels, the spec-v2
  dependency folders of ``make install``) therefore fails loudly; ``DDTREE_ALLOW_SKIPS=1`` turns failures back into
  skips for a deliberately partial local run (never in CI).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

# Triton decides interpreted or compiled when a function is decorated, and ``triton.language`` decorates its own
# standard functions (``tl.zeros``, ...) when it is first imported. So on a machine without an NVIDIA GPU the whole
# test process runs Triton interpreted, set here before any test module can import triton: set later (by the first
# runtime test file to load), a worker that had already imported triton through another test mixes compiled
# standard functions into interpreted kernels ("Cannot call @triton.jit'd outside of the scope of a kernel").
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ddtree_deploy.inventory import Host, load_inventory
from ddtree_deploy.sandbox import DEFAULT_HOSTS, SSHD, Sandbox, SandboxState

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

#: fixtures whose presence in a test's closure means real sshd hosts (``sandbox``) or real wheels (``wheels``)
SANDBOX_FIXTURES = frozenset({"sandbox"})
WHEEL_FIXTURES = frozenset({"base_wheel", "v2_trees", "wheel_env", "wheel_023", "wheel_011"})
#: folders whose tests all work on patched SGLang trees (built from the real wheels)
WHEEL_DIRS = (TESTS / "sglang_v1", TESTS / "sglang_v2")

#: (marker or node-id prefix, skip-reason pattern, why this skip is legitimate). Every other skip fails the run.
ALLOWED_SKIPS: tuple[tuple[str, str, str], ...] = (
    ("gpu", r"needs a CUDA device|no sglang importable|needs the offline bundle",
     "GPU tests run only on a GPU host (make test-gpu); the CPU suite deselects them"),
    ("tests/test_setup.py", r"needs an externally-managed system Python",
     "the set-up test needs a PEP 668 system Python (Debian/Ubuntu's python3); machines without one have nothing "
     "to prove there"),
    ("tests/cli/", r"^DDTREE_NO_REGISTRY=1",
     "the user said there is no package registry: the wheel cannot be installed with its dependencies"),
)


def _allowed_skip(item: pytest.Item, reason: str) -> str | None:
    for where, pattern, why in ALLOWED_SKIPS:
        hit = item.get_closest_marker(where) is not None if "/" not in where else item.nodeid.startswith(where)
        if hit and re.search(pattern, reason):
            return why
    return None


#: The files that take longest, in seconds of one run (--durations=0 on 2 loaded cores, December 2026; relative order is
#: what counts). Test workers take whole files (``--dist loadfile``) in collection order, so these go first: the longest
#: file no longer starts last and becomes the run's tail (the longest-first rule). A file not listed keeps its place.
LONG_FILES = {
    "tests/test_faults_host.py": 300, "tests/test_faults.py": 270, "tests/sglang_v2/test_hybrid_v2.py": 362,
    "tests/cli/test_cli_tune.py": 361, "tests/cli/test_cli_hostile.py": 250, "tests/sglang_v2/test_v2_metrics.py": 213,
    "tests/sglang_v2/test_v2_server_args.py": 212, "tests/sglang_v2/test_v2_backends.py": 212,
    "tests/test_deploy_apply.py": 183, "tests/cli/test_cli_launch_flags.py": 177, "tests/cli/test_cli_decide.py": 166,
    "tests/cli/test_cli_ansible.py": 152, "tests/bench/test_bench_draft_topk.py": 115, "tests/cli/test_cli_local.py": 108,
    "tests/test_snapshot.py": 86, "tests/bench/test_e2e_hybrid_v2.py": 86, "tests/sglang_v2/test_v2_launch_check.py": 83,
    "tests/test_demo.py": 82,
}


def _longest_files_first(items: list[pytest.Item]) -> None:
    order: dict[Path, int] = {}
    for item in items:
        order.setdefault(item.path, len(order))
    weight = {path: LONG_FILES.get(path.relative_to(REPO).as_posix(), 0) if path.is_relative_to(REPO) else 0
              for path in order}
    items.sort(key=lambda item: (-weight[item.path], order[item.path]))  # stable: a file's own order is kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & SANDBOX_FIXTURES and item.get_closest_marker("sandbox") is None:
            item.add_marker(pytest.mark.sandbox)
        in_wheel_dir = any(item.path.is_relative_to(d) for d in WHEEL_DIRS)
        if (names & WHEEL_FIXTURES or in_wheel_dir) and item.get_closest_marker("wheels") is None:
            item.add_marker(pytest.mark.wheels)


def _fail_unexpected_skip(rep: pytest.TestReport | pytest.CollectReport, item: pytest.Item | None) -> None:
    partial_run = os.environ.get("DDTREE_ALLOW_SKIPS") == "1" and not os.environ.get("CI")
    if not rep.skipped or hasattr(rep, "wasxfail") or partial_run:
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if item is None or _allowed_skip(item, reason) is None:
        rep.outcome = "failed"
        rep.longrepr = (f"unexpected skip: {reason}\nEvery test must run here (make install provides what they "
                        "need); a skip that is legitimate goes on ALLOWED_SKIPS in tests/conftest.py with its reason. "
                        "DDTREE_ALLOW_SKIPS=1 allows skips for a deliberately partial local run.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A skip that is not on ALLOWED_SKIPS is a failure: what CI expects to run must run."""
    outcome = yield
    _fail_unexpected_skip(outcome.get_result(), item)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """The same for a whole module skipped at import (``pytest.importorskip`` at the top of a file)."""
    outcome = yield
    _fail_unexpected_skip(outcome.get_result(), None)


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
