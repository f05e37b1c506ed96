"""Fixtures for the reference-engine tests (helpers live in refengine_helpers.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from refengine_helpers import PKG_DIR, RUNTIME_DIR


@pytest.fixture(scope="session")
def runtime():
    """The DDTree runtime from patches/ddtree/runtime (or $DDTREE_RUNTIME_PATH), via the engine's own loader."""
    from ddtree_refengine.runtime_loader import load_runtime

    return load_runtime(RUNTIME_DIR)


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory) -> Path:
    """A scratch site dir holding a copy of the package as ``ddtree_refengine``, like a sandbox host."""
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(PKG_DIR, site / "ddtree_refengine", ignore=shutil.ignore_patterns("__pycache__"))
    return site


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny tensors: intra-op threads only add contention (40x slower on a loaded 2-core box). Restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
