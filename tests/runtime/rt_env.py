"""Where the runtime lives, how the tests load it, and the run seed: imported by conftest and by test modules.

Kept out of conftest.py because several test folders have a conftest, and `from conftest import ...` picks
whichever was loaded last.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime as load_runtime_dir

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
