"""The loader finds the runtime inside the installed sglang without importing sglang, and fails clearly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddtree_refengine import runtime_loader
from ddtree_refengine.runtime_loader import RuntimeLoadError, load_runtime, locate_runtime_dir
from refengine_helpers import RUNTIME_DIR


def _fake_sglang(root: Path, with_overlay: bool) -> Path:
    """An sglang package whose import raises: the loader must never import it."""
    pkg = root / "sglang"
    (pkg / "srt" / "speculative").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('sglang must not be imported by the loader')\n")
    if with_overlay:
        os.symlink(RUNTIME_DIR, pkg / "srt" / "speculative" / "ddtree")
    return pkg


@pytest.fixture
def no_override(monkeypatch):
    monkeypatch.delenv(runtime_loader.ENV_VAR, raising=False)


def test_loads_overlay_from_installed_sglang_without_importing_it(tmp_path, monkeypatch, no_override):
    pkg = _fake_sglang(tmp_path, with_overlay=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate_runtime_dir() == (pkg / "srt" / "speculative" / "ddtree").resolve()
    module = load_runtime(module_name="ddtree_runtime_loader_test")
    try:
        assert "sglang" not in sys.modules
        assert Path(module.__file__).resolve() == (RUNTIME_DIR / "__init__.py").resolve()
        assert runtime_loader.describe(module)["version"] == module.__version__
        assert load_runtime(module_name="ddtree_runtime_loader_test") is module  # reused, not re-executed
    finally:
        for name in [n for n in sys.modules if n.startswith("ddtree_runtime_loader_test")]:
            del sys.modules[name]


def test_unpatched_sglang_names_the_missing_file(tmp_path, monkeypatch, no_override):
    pkg = _fake_sglang(tmp_path, with_overlay=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeLoadError) as err:
        load_runtime(module_name="ddtree_runtime_loader_test")
    message = str(err.value)
    assert str(pkg.resolve() / "srt" / "speculative" / "ddtree" / "__init__.py") in message
    assert "not patched" in message


_NO_SGLANG = """
import sys
sys.path.insert(0, sys.argv[1])
from ddtree_refengine.runtime_loader import RuntimeLoadError, locate_runtime_dir
try:
    locate_runtime_dir()
except RuntimeLoadError as exc:
    print("REFUSED", exc)
"""


def test_no_sglang_at_all(site_dir):
    """Where no sglang is importable at all. Run in a Python without site-packages (-I -S: no sglang whatever this
    machine has installed, no $DDTREE_RUNTIME_PATH) holding only the deployed copy of the engine, so it runs
    everywhere instead of only where sglang happens to be missing."""
    r = subprocess.run([sys.executable, "-I", "-S", "-c", _NO_SGLANG, str(site_dir)], capture_output=True, text=True,
                       timeout=60, env={k: v for k, v in os.environ.items() if k != runtime_loader.ENV_VAR})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("REFUSED") and "no 'sglang' package is importable" in r.stdout, r.stdout


def test_env_override_and_incomplete_runtime(tmp_path, monkeypatch):
    (tmp_path / "__init__.py").write_text("def draft_topk(*a, **k):\n    pass\n")
    monkeypatch.setenv(runtime_loader.ENV_VAR, str(tmp_path))
    assert locate_runtime_dir() == tmp_path.resolve()
    with pytest.raises(RuntimeLoadError, match="lacks build_tree, build_verify_inputs") as err:
        load_runtime(module_name="ddtree_runtime_loader_test")
    assert "draft_topk" not in str(err.value).split("lacks")[1]
    assert "ddtree_runtime_loader_test" not in sys.modules  # a rejected runtime is not left half-registered
