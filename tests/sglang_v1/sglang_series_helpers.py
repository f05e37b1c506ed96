"""Paths and helpers of the SGLang 0.5.11 patch-set tests: unpack the base wheel, apply the series, hash, load.

Kept out of conftest.py because several test folders have a conftest, and `from conftest import ...` picks
whichever was loaded last.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PSET = REPO / "patches" / "ddtree" / "sglang-0.5.11"
CACHE = Path(os.environ.get("DDTREE_WHEEL_CACHE", Path.home() / ".cache" / "ddtree-deploy" / "wheels"))


def patchset() -> dict:
    return yaml.safe_load((PSET / "patchset.yaml").read_text())


def touched(patch: Path) -> list[str]:
    return [ln.split(" b/", 1)[1] for ln in patch.read_text().splitlines() if ln.startswith("diff --git a/")]


def unpack(wheel: Path, dest: Path, only: list[str] | None = None) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith("sglang/") and not n.endswith("/")]
        if only is not None:
            names = [n for n in names if n in set(only)]
        for n in names:
            p = dest / n
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(zf.read(n))


def build_patched(wheel: Path, dest: Path) -> Path:
    """The whole base package with the 0.5.11 series applied and the runtime vendored, by the product's own
    patch-set code (what `ddtree-deploy patchset build --full` writes)."""
    from ddtree_deploy.patchset.apply import apply_patchset
    from ddtree_deploy.patchset.base import WheelBase
    from ddtree_deploy.patchset.build import write_overlay
    from ddtree_deploy.patchset.format import load_patchset

    base = WheelBase(wheel)
    write_overlay(apply_patchset(load_patchset(PSET / "patchset.yaml"), base).overlay, base, dest, full=True)
    return dest


def apply_series(wheel: Path, *, upto: int | None = None, allow_base_drift: bool = False):
    """The 0.5.11 series (or its first ``upto`` patches) applied to ``wheel`` by the product's apply engine
    (all-or-nothing, fuzz 0): the ApplyResult, whose overlay holds every patched and vendored file."""
    import dataclasses

    from ddtree_deploy.patchset.apply import apply_patchset
    from ddtree_deploy.patchset.base import WheelBase
    from ddtree_deploy.patchset.format import load_patchset

    ps = load_patchset(PSET / "patchset.yaml")
    if upto is not None:
        ps = dataclasses.replace(ps, patches=ps.patches[:upto])
    return apply_patchset(ps, WheelBase(wheel), allow_base_drift=allow_base_drift)


def unpack_prefix(wheel: Path, dest: Path, files: list[str], upto: int) -> None:
    """``files`` of the base under ``dest``, with the first ``upto`` patches applied by the product over them."""
    unpack(wheel, dest, only=files)
    for f in apply_series(wheel, upto=upto).overlay.files:
        (dest / f.path).parent.mkdir(parents=True, exist_ok=True)
        (dest / f.path).write_bytes(f.content)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_TORCHVISION_STUB = '''import enum as _enum
class InterpolationMode(_enum.Enum):
    NEAREST = "nearest"; NEAREST_EXACT = "nearest-exact"; BILINEAR = "bilinear"; BICUBIC = "bicubic"
    BOX = "box"; HAMMING = "hamming"; LANCZOS = "lanczos"
class _Placeholder:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): raise RuntimeError("torchvision stand-in")
def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder
'''


def write_torchvision_stub(dest: Path) -> Path:
    """A stand-in torchvision package (with dist-info) under ``dest``: sglang imports torchvision at module level,
    and the real one would pull a CUDA torch onto a CPU box. Returns ``dest`` (a directory for PYTHONPATH)."""
    for sub in ["torchvision", "torchvision/transforms", "torchvision/transforms/v2"]:
        (dest / sub).mkdir(parents=True, exist_ok=True)
    for f in ["torchvision/io.py", "torchvision/ops.py", "torchvision/transforms/functional.py",
              "torchvision/transforms/v2/functional.py"]:
        (dest / f).write_text(_TORCHVISION_STUB)
    (dest / "torchvision/__init__.py").write_text(_TORCHVISION_STUB + '__version__ = "0.26.0"\nfrom . import io, ops, transforms\n')
    (dest / "torchvision/transforms/__init__.py").write_text(_TORCHVISION_STUB + "from . import functional, v2\n")
    (dest / "torchvision/transforms/v2/__init__.py").write_text(_TORCHVISION_STUB + "from . import functional\n")
    (dest / "torchvision-0.26.0.dist-info").mkdir(exist_ok=True)
    (dest / "torchvision-0.26.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.26.0\n")
    (dest / "torchvision-0.26.0.dist-info/RECORD").write_text("")
    return dest


def sglang_subprocess_env(patched_tree: Path, workdir: Path) -> dict:
    """Environment for a subprocess that imports the patched sglang on CPU: the patched tree first, then the
    optional extra dependency dir ($DDTREE_SGLANG_DEPS), the torchvision stand-in, the caller's PYTHONPATH."""
    stub = write_torchvision_stub(workdir / "stub")
    extra = os.environ.get("DDTREE_SGLANG_DEPS", "")
    pp = os.pathsep.join(p for p in [str(patched_tree), extra, str(stub), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": pp, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
