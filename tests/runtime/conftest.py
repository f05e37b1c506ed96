"""Fixtures of the runtime tests; the runtime is loaded as the package ``ddtree_runtime`` (by path, as overlays do)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # rt_env, heap_oracle and helpers

from rt_env import RUN_SEED, load_runtime  # noqa: E402

load_runtime()


def pytest_report_header(config):  # noqa: D103
    return f"ddtree runtime tests: DDTREE_TEST_SEED={RUN_SEED}"


@pytest.fixture
def rt():
    return sys.modules["ddtree_runtime"]


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the run seed and the test's name."""
    g = torch.Generator()
    g.manual_seed((RUN_SEED * 1000003 + sum(map(ord, request.node.nodeid))) & 0x7FFFFFFFFFFF)
    return g


@pytest.fixture
def dev() -> torch.device:
    """Where kernel-vs-reference tests run: the GPU when present, else CPU through the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
