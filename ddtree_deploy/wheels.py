"""A local cache of SGLang wheels, downloaded once from the package registry without dependencies.

The sandbox installs real SGLang releases on its hosts and the patch-set tools read base files from them; both
come from here so a second run needs no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .errors import OperationFailed


def cache_dir() -> Path:
    return Path(os.environ.get("DDTREE_WHEEL_CACHE", Path.home() / ".cache" / "ddtree-deploy" / "wheels"))


def find_cached(package: str, version: str) -> Path | None:
    stem = package.replace("-", "_")
    matches = sorted(cache_dir().glob(f"{stem}-{version}-*.whl"))
    return matches[0] if matches else None


def fetch_wheel(package: str, version: str, *, python_version: str | None = None) -> Path:
    """Path of ``package==version``'s wheel for this interpreter, downloading it (no deps) if not cached."""
    cached = find_cached(package, version)
    if cached:
        return cached
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    pyver = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", pyver,
           "--quiet", "-d", str(target), f"{package}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise OperationFailed(
            f"cannot download {package}=={version} from the package registry: {proc.stderr.strip()[-600:]}",
            hint=f"put the wheel into {target} by hand (pip download --no-deps {package}=={version})",
        )
    cached = find_cached(package, version)
    if not cached:
        raise OperationFailed(f"pip reported success but no {package}-{version} wheel is in {target}")
    return cached
