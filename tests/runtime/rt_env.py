"""Where the runtime lives, how the tests load it, and the run seed: imported by conftest and by test modules.

Kept out of conftest.py because several test folders have a conftest, and `from conftest import ...` picks
whichever was loaded last.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def _runtime_loader():
    """The sandbox's runtime loader (stdlib only) by its path: importing it as ``ddtree_deploy.sandbox...`` runs the
    sandbox package's ``__init__`` and its dependencies (tenacity, platformdirs), which the GPU machine, where these
    tests also run (``TRITON_INTERPRET=0``, with only the SGLang bundle installed), does not have."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[2] / "ddtree_deploy" / "sandbox" / "refengine" / "runtime_loader.py"
    name = "_ddtree_runtime_loader"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


load_runtime_dir = _runtime_loader().load_runtime

# Without a GPU the Triton kernels run in the interpreter (must be set before triton.jit decorates them).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "patches" / "ddtree" / "runtime"


def load_runtime(name: str = "ddtree_runtime"):
    """Import the runtime folder as a package under ``name`` (by path, as overlays vendor it)."""
    return load_runtime_dir(RUNTIME_DIR, module_name=name)


# One seed per test run (printed, overridable) so inputs vary between runs yet a failure can be replayed.
RUN_SEED = int(os.environ.get("DDTREE_TEST_SEED", str(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)))


def _triton_runs() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


needs_triton = pytest.mark.skipif(not _triton_runs(), reason="triton missing, or no CUDA and TRITON_INTERPRET != 1")
