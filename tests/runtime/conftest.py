"""Load patches/ddtree/runtime as the package ``ddtree_runtime`` (how the overlay vendors it: by path)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run in the interpreter (must be set before triton.jit decorates them).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "patches" / "ddtree" / "runtime"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # heap_oracle and helpers


def load_runtime(name: str = "ddtree_runtime"):
    """Import the runtime folder as a package under ``name`` (submodules resolve relative to it)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, RUNTIME_DIR / "__init__.py",
                                                  submodule_search_locations=[str(RUNTIME_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


load_runtime()

# One seed per test run (printed, overridable) so inputs vary between runs yet a failure can be replayed.
RUN_SEED = int(os.environ.get("DDTREE_TEST_SEED", str(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)))


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


def _triton_runs() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


needs_triton = pytest.mark.skipif(not _triton_runs(), reason="triton missing, or no CUDA and TRITON_INTERPRET != 1")


@pytest.fixture
def dev() -> torch.device:
    """Where kernel-vs-reference tests run: the GPU when present, else CPU through the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
