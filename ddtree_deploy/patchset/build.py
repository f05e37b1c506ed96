"""Writing an overlay to a directory: the files a release would carry, or a whole patched copy of the package.

``patchset build`` is how anything outside a deploy (the GPU proof harness, a developer trying a series by hand)
gets a patched tree from the product's own patch-set code instead of re-applying series itself. The output is
written into a fresh directory and renamed into place last, so a failure leaves no half-built tree behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..overlay import Overlay
from .base import BaseSource


@dataclass(frozen=True)
class BuildResult:
    out: Path
    overlay_files: int
    base_files: int
    digest: str


def write_overlay(overlay: Overlay, base: BaseSource, out: Path, *, full: bool = False) -> BuildResult:
    """Write ``overlay`` under ``out`` laid out like site-packages (``out/sglang/...``).

    ``full`` also writes every base file the overlay does not replace, so ``out`` alone is an importable patched
    package (put it first on PYTHONPATH). ``out`` must not exist yet (or be an empty directory); an
    ``overlay.json`` beside the package records the overlay's digest, patch set and files.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"{out}: exists and is not an empty directory (refusing to write into it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    try:
        written = {f.path for f in overlay.files}
        base_count = 0
        if full:
            for path in base.list_files():
                if path in written or path.endswith((".pyc", ".pyo")) or "/__pycache__/" in path:
                    continue
                _write(stage / path, base.read(path), base.mode(path))
                base_count += 1
        for f in overlay.files:
            _write(stage / f.path, f.content, f.mode)
        (stage / "overlay.json").write_text(json.dumps(overlay.describe() | {"full": full}, indent=1) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return BuildResult(out=out, overlay_files=len(overlay.files), base_files=base_count, digest=overlay.digest)


def _write(path: Path, content: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    os.chmod(path, mode & 0o777)
