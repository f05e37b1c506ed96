"""Which patched SGLang the GPU tests find on the path, found without importing it (it pulls CUDA-only modules).

The GPU tests need a real ``sglang`` package (the offline bundle's wheel with the DDTree overlay laid over it,
``PYTHONPATH=/tmp/overlay:/tmp/site`` after ``bench/e2e/gpu_run.sh``), and each needs one base: the base-kernel
check is 0.5.11's (``sglang/srt/speculative/ddtree_hybrid.py``, vendored from spec-v1), the spec-v2 check is 0.5.17's
(``sglang/srt/speculative/ddtree_v2/hybrid.py``). A test whose base is not the one on the path skips, naming what it
needs and what it found (reasons that tests/conftest.py's ALLOWED_SKIPS accepts for the ``gpu`` marker). Only a
regular package counts: a folder named ``sglang`` without ``__init__.py`` (a namespace package) is never SGLang.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

#: the DDTree overlay's marker file of each base whose GPU checks live in tests/gpu
MARKERS = {"0.5.11": "srt/speculative/ddtree_hybrid.py", "0.5.17": "srt/speculative/ddtree_v2/hybrid.py"}


def sglang_dir() -> Path | None:
    """The importable sglang package directory (a regular package), or None."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None  # nothing, or a namespace package (a bare folder named sglang somewhere on sys.path)
    d = Path(list(spec.submodule_search_locations)[0])
    return d if (d / "__init__.py").is_file() else None


def sglang_version(d: Path) -> str | None:
    """The installed distribution's version (its dist-info, as ``import sglang`` reports it: the bundle's wheel in
    /tmp/site under the overlay), else ``sglang/version.py``'s ``__version__`` read as text. The wheels' own
    ``version.py`` holds a placeholder (``0.0.0.dev0``, seen on the H200 with 0.5.17), so it is only the fallback."""
    from importlib.metadata import distributions

    for dist in distributions(name="sglang"):  # the first on sys.path, as import finds the package
        return dist.version
    try:
        m = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", (d / "version.py").read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def skip_reason(base: str) -> str | None:
    """Why a GPU test of ``base``'s patch set cannot run with the sglang on the path (None: it can)."""
    d = sglang_dir()
    if d is None:
        return ("no sglang importable (the offline bundle with the DDTree overlay: PYTHONPATH=/tmp/overlay:/tmp/site "
                "after bench/e2e/gpu_run.sh)")
    version = sglang_version(d)
    if version != base:
        return (f"needs the offline bundle of SGLang {base} with the DDTree overlay; the sglang importable at {d} is "
                f"{version or 'of unknown version'}")
    if not (d / MARKERS[base]).is_file():
        return (f"needs the offline bundle of SGLang {base} with the DDTree overlay; {d} has no {MARKERS[base]} "
                "(stock SGLang without the overlay?)")
    return None
