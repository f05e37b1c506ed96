"""The spec-v2 patch set's own modules (``patches/ddtree/spec-v2/<name>.py``), loaded by path for tests: its tables
(bases, backends: pure data) and the glue modules a test drives with stand-ins. Loaded once per process, under
``ddtree_v2_<name>``, so every test module sees the same module object."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SPEC_V2 = Path(__file__).resolve().parents[1] / "patches" / "ddtree" / "spec-v2"


def load(name: str) -> ModuleType:
    key = f"ddtree_v2_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, SPEC_V2 / f"{name}.py")
    assert spec and spec.loader, f"{SPEC_V2 / f'{name}.py'}: not a loadable module"
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod


def bases_table() -> dict:
    """The spec-v2 bases as the overlay's generated ``bases.json`` gives them to ``bases.py``: the ``traits:`` of
    every base folder under patches/ddtree/, read by the product (``family_traits``), checked by ``bases.table``."""
    from ddtree_deploy.patchset.traits import family_traits

    family = SPEC_V2.parent
    return load("bases").table(family_traits(family, f"sglang/srt/speculative/ddtree_v2/{load('bases').TABLE_FILE}"),
                               str(family))
