"""Load the DDTree runtime from the installed (possibly overlaid) sglang, without importing sglang.

Why not ``import sglang.srt.speculative.ddtree``: importing sglang pulls CUDA-only dependencies
that a sandbox host lacks. What the deployment must prove is that the server's interpreter
resolves ``sglang`` to the active release and that the release carries the DDTree modules, so
we resolve the package directory with ``find_spec`` (which reads the path, not the package) and
load only ``srt/speculative/ddtree/__init__.py`` as its own package ``ddtree_runtime``.
``DDTREE_RUNTIME_PATH`` (a directory holding ``__init__.py``) overrides the lookup for tests.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ENV_VAR = "DDTREE_RUNTIME_PATH"
MODULE_NAME = "ddtree_runtime"
OVERLAY_SUBDIR = Path("srt") / "speculative" / "ddtree"
REQUIRED = (
    "draft_topk",
    "build_tree",
    "build_verify_inputs",
    "sample_target_tokens",
    "accept_walk",
    "kv_compaction",
)


class RuntimeLoadError(RuntimeError):
    """The DDTree runtime cannot be loaded; the message names the missing file or function."""


def locate_runtime_dir() -> Path:
    """Directory of the runtime package: $DDTREE_RUNTIME_PATH, else <sglang>/srt/speculative/ddtree."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).resolve()
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeLoadError(
            "DDTREE requested but no 'sglang' package is importable by "
            f"{sys.executable} (importlib.util.find_spec('sglang') found nothing); "
            f"install sglang or set {ENV_VAR}"
        )
    return (Path(list(spec.submodule_search_locations)[0]) / OVERLAY_SUBDIR).resolve()


def load_runtime(path: str | os.PathLike | None = None, module_name: str = MODULE_NAME) -> ModuleType:
    """Import the runtime package found at ``path`` (default: ``locate_runtime_dir()``) as ``module_name``.

    A module already imported under that name from the same file is reused, so the engine and
    tests share one copy; one from another file is replaced, never silently mixed.
    """
    runtime_dir = Path(path).resolve() if path is not None else locate_runtime_dir()
    init = runtime_dir / "__init__.py"
    if not init.is_file():
        raise RuntimeLoadError(
            f"DDTree runtime missing: {init} does not exist. The sglang in use is not patched with the "
            "DDTree overlay (deploy a release that vendors srt/speculative/ddtree/), or "
            f"{ENV_VAR} points at the wrong directory."
        )
    existing = sys.modules.get(module_name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == init.resolve():
        return existing
    for name in [n for n in sys.modules if n == module_name or n.startswith(module_name + ".")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(module_name, init, submodule_search_locations=[str(runtime_dir)])
    if spec is None or spec.loader is None:
        raise RuntimeLoadError(f"cannot create an import spec for {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    missing = [fn for fn in REQUIRED if not callable(getattr(module, fn, None))]
    if missing:
        for name in [n for n in sys.modules if n == module_name or n.startswith(module_name + ".")]:
            del sys.modules[name]
        raise RuntimeLoadError(f"DDTree runtime at {init} lacks {', '.join(missing)} (API: docs/runtime-api.md)")
    return module


def describe(module: ModuleType) -> dict:
    """Where the runtime was loaded from and its version, for /get_server_info and the start line."""
    return {"path": str(Path(module.__file__).resolve().parent), "version": getattr(module, "__version__", None)}
