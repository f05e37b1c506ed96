"""Fixtures for the SGLang 0.5.11 DDTree patch set: the real base wheel, the series applied to it, the overlay.

The base wheel is fetched once with `pip download --no-deps sglang==0.5.11` into ~/.cache/ddtree-deploy/wheels
(override with DDTREE_WHEEL_CACHE); tests skip with the reason only when the registry is unreachable.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from once import built_once  # noqa: E402
from sglang_series_helpers import CACHE, build_patched, load_module, patchset  # noqa: E402

@pytest.fixture(scope="session")
def base_wheel() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob("sglang-0.5.11-*.whl"))
    if found:
        return found[0]
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                        "-d", str(CACHE), "sglang==0.5.11"], capture_output=True, text=True, timeout=600)
    found = sorted(CACHE.glob("sglang-0.5.11-*.whl"))
    if not found:
        pytest.skip(f"sglang 0.5.11 wheel not cached and the registry is unreachable: {r.stderr.strip()[-300:]}")
    return found[0]


@pytest.fixture(scope="session")
def patched_tree(base_wheel: Path, tmp_path_factory) -> Path:
    """The whole sglang 0.5.11 package with the series applied and the runtime vendored, as the product builds it
    (`patchset build --full`)."""
    return built_once(tmp_path_factory, "sglang-0.5.11-patched", lambda dest: build_patched(base_wheel, dest))


@pytest.fixture(scope="session")
def runtime(patched_tree: Path):
    """The runtime as vendored in the patched tree, loaded as a stand-alone package."""
    name = "ddtree_sglang_vendored_runtime"
    if name in sys.modules:
        return sys.modules[name]
    d = patched_tree / patchset()["runtime"]["dest"]
    spec = importlib.util.spec_from_file_location(name, d / "__init__.py", submodule_search_locations=[str(d)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def ddtree_verify(patched_tree: Path, runtime):
    """The patch set's ddtree_verify module (torch-only at import), bound to the vendored runtime."""
    mod = load_module("ddtree_sglang_verify", patched_tree / "sglang/srt/speculative/ddtree_verify.py")
    mod._RUNTIME = runtime
    return mod
