# Quick host identity for `hosts check`: interpreter and the installed sglang, without importing sglang.
import os
import platform
import sys


def _dist_version(name):
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return metadata.version(name)
    except Exception:
        return None


def check(site_packages):
    pkg = os.path.join(site_packages, "sglang")
    return {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "site_packages_exists": os.path.isdir(site_packages),
        "sglang_dir_exists": os.path.isdir(pkg),
        "sglang": _dist_version("sglang"),
    }


OPS = {"check": check}
