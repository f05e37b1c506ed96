"""Where ddtree-deploy reads its patch sets and inventory and keeps its snapshot store, retry file and sandbox.

One rule for each: an explicit flag, else the environment variable, else the source checkout when the package
runs from one (``make demo`` / ``make test`` keep using the repo's ``patches/``, ``hosts/``, ``snapshots/``), else
the installed package data (patch sets) or the user's XDG directories (found by ``platformdirs``). The
inventory is the one exception to "one place": a checkout reads its ``hosts/`` and the user's inventory both
(``inventory_dirs``). Never the current directory by accident:
a command run from ``/tmp`` must not pick up ``/tmp/patches`` or write a ``/tmp/snapshots`` store.

================  ==================  =================  ===========================================
what              variable            in a checkout      installed
================  ==================  =================  ===========================================
patch sets        $DDTREE_PATCHES     patches/           the wheel's ``ddtree_deploy/_patches``
inventory         $DDTREE_INVENTORY   hosts/ + user's    $XDG_CONFIG_HOME/ddtree-deploy/hosts
snapshot store    $DDTREE_SNAPSHOTS   snapshots/         $XDG_DATA_HOME/ddtree-deploy/snapshots
retry file        (``--retry-file``)  ddtree-deploy.retry  $XDG_STATE_HOME/ddtree-deploy/last-apply.retry
sandbox state     $DDTREE_SANDBOX_DIR .sandbox/          $XDG_STATE_HOME/ddtree-deploy/sandbox
================  ==================  =================  ===========================================
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path

import platformdirs

log = logging.getLogger("ddtree_deploy.paths")

PACKAGE_DIR = Path(__file__).resolve().parent
#: Where the wheel carries the patch sets (copied from the repo's top-level patches/ by the build, see setup.py).
PACKAGED_PATCHES = PACKAGE_DIR / "_patches"
APP = "ddtree-deploy"


@lru_cache(maxsize=1)
def checkout_root() -> Path | None:
    """The source checkout this package is imported from, or None for an installed package.

    A checkout is the package's parent directory when it holds this project's pyproject.toml and patches/; an
    installed package's parent is site-packages, which has neither.
    """
    root = PACKAGE_DIR.parent
    project = root / "pyproject.toml"
    if not project.is_file() or not (root / "patches").is_dir():
        return None
    try:
        text = project.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return root if f'name = "{APP}"' in text else None


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/ddtree-deploy`` (platformdirs: the platform's rules, a relative XDG value ignored)."""
    return platformdirs.user_config_path(APP, appauthor=False)


def data_dir() -> Path:
    return platformdirs.user_data_path(APP, appauthor=False)


def state_dir() -> Path:
    return platformdirs.user_state_path(APP, appauthor=False)


def _env_path(variable: str) -> Path | None:
    value = os.environ.get(variable)
    return Path(value).expanduser() if value else None


def _chosen(variable: str | None, in_checkout: str, installed: Path) -> Path:
    """The variable's path if set, else ``in_checkout`` under the checkout, else the installed default."""
    env = _env_path(variable) if variable else None
    if env is not None:
        return _note(env, f"${variable}")
    checkout = checkout_root()
    return _note(checkout / in_checkout, "the checkout") if checkout else _note(installed, "the installed default")


@lru_cache(maxsize=None)
def _noted(path: Path, why: str) -> None:
    log.debug("using %s (%s)", path, why)


def _note(path: Path, why: str) -> Path:
    """Log each path choice once per run (``-v`` shows where things were looked for)."""
    _noted(path, why)
    return path


def patches_root() -> Path:
    """``$DDTREE_PATCHES``, else the checkout's ``patches/``, else the patch sets shipped in the package."""
    return _chosen("DDTREE_PATCHES", "patches", PACKAGED_PATCHES)


def user_inventory_dir() -> Path:
    """The inventory of an installed tool: ``$XDG_CONFIG_HOME/ddtree-deploy/hosts``."""
    return config_dir() / "hosts"


def inventory_dir() -> Path:
    """Where new host files are written (``sandbox up``): ``$DDTREE_INVENTORY``, else the checkout's ``hosts/``,
    else the user inventory."""
    return _chosen("DDTREE_INVENTORY", "hosts", user_inventory_dir())


def inventory_dirs() -> list[tuple[Path, str]]:
    """The inventory directories read, each with where it comes from (``hosts list`` shows it).

    ``$DDTREE_INVENTORY`` alone when set. In a checkout, its ``hosts/`` *and* the user inventory (a host file put
    where the README's first steps say is found from a checkout too); a name defined in both makes that host
    unusable, the error naming both files. Installed: the user inventory.
    """
    env = _env_path("DDTREE_INVENTORY")
    if env is not None:
        return [(_note(env, "$DDTREE_INVENTORY"), "$DDTREE_INVENTORY")]
    checkout = checkout_root()
    user = (user_inventory_dir(), "user")
    return [(_note(checkout / "hosts", "the checkout"), "checkout"), user] if checkout else [user]


def inventory_is_explicit() -> bool:
    """True when the inventory was chosen by the user (a missing one is then an error, not an empty inventory)."""
    return bool(os.environ.get("DDTREE_INVENTORY"))


def snapshot_root() -> Path:
    """``$DDTREE_SNAPSHOTS``, else the checkout's ``snapshots/``, else ``$XDG_DATA_HOME/ddtree-deploy/snapshots``."""
    return _chosen("DDTREE_SNAPSHOTS", "snapshots", data_dir() / "snapshots")


def retry_file() -> Path:
    """Where ``apply`` lists the hosts that failed, for ``--retry-failed``."""
    return _chosen(None, "ddtree-deploy.retry", state_dir() / "last-apply.retry")


def sandbox_dir() -> Path:
    """``$DDTREE_SANDBOX_DIR``, else the checkout's ``.sandbox/``, else ``$XDG_STATE_HOME/ddtree-deploy/sandbox``."""
    return _chosen("DDTREE_SANDBOX_DIR", ".sandbox", state_dir() / "sandbox").absolute()
