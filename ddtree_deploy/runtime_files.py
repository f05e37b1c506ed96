"""The DDTree runtime's stdlib-only modules (``schedule.py``, ``metrics.py``) as the control side uses them: loaded
by path from the patch sets this tool ships (the very files an overlay vendors), once per process. ``tune`` fits
schedules with the one, ``bench``, ``tune`` and the live columns of ``probe`` / ``releases`` read a server's
``/metrics`` with the other."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from . import paths
from .errors import InputError


def runtime_module(stem: str, what: str) -> ModuleType:
    """The runtime's stdlib-only ``<stem>.py`` (``schedule``, ``metrics``), loaded by path from the patch sets this
    tool ships (the file the overlay vendors)."""
    name = f"ddtree_deploy_runtime_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    path = paths.patches_root() / "ddtree" / "runtime" / f"{stem}.py"
    if not path.is_file():
        raise InputError(f"{path}: the DDTree runtime's {what} is missing from the patch sets")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before exec: it holds a dataclass
    spec.loader.exec_module(mod)
    return mod


def metrics_module() -> ModuleType:
    """The runtime's ``metrics.py``: DDTree's Prometheus families and how a scrape is read."""
    return runtime_module("metrics", "metric definitions")


__all__ = ["metrics_module", "runtime_module"]
