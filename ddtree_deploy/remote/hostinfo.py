# Quick host identity for `hosts check`: interpreter and the installed sglang, without importing sglang; and the
# host file's paths as this host resolves them (`paths`: symlinks and `..` followed, as a write would follow them).
import os
import platform
import sys

# How many entries of the release root (and of its releases/) are looked at for symlinks: a real root holds a few.
_MAX_ENTRIES = 4096


def _dist_version(name):
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return metadata.version(name)
    except Exception:
        return None


def _links_in(directory, prefix, out):
    try:
        names = sorted(os.listdir(directory))[:_MAX_ENTRIES]
    except OSError:
        return
    for name in names:
        full = os.path.join(directory, name)
        if os.path.islink(full):
            out[prefix + name] = os.path.realpath(full)


def paths(release_root, site_packages, interpreter, package="sglang"):
    """Each path of the host file resolved with realpath on this host (symlinks anywhere on the way, `..` after a
    symlink, a venv's lib64 -> lib), and every symlink among the release root's entries and releases with where it
    leads: a write through any of them lands there. The control side judges (hostpaths.py)."""
    links = {}
    if os.path.isdir(release_root):
        _links_in(release_root, "", links)
        releases = os.path.join(release_root, "releases")
        if os.path.isdir(releases) and not os.path.islink(releases):
            _links_in(releases, "releases/", links)
    return {
        "release_root": os.path.realpath(release_root),
        "site_packages": os.path.realpath(site_packages),
        "package": os.path.realpath(os.path.join(site_packages, package)),
        "python": os.path.realpath(interpreter),
        "executable": os.path.realpath(sys.executable),
        "links": links,
    }


def check(site_packages, release_root=None, interpreter=None):
    """Who answers, and (given the release root and python (``interpreter``) of the host file) its paths as resolved here."""
    pkg = os.path.join(site_packages, "sglang")
    out = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "site_packages_exists": os.path.isdir(site_packages),
        "sglang_dir_exists": os.path.isdir(pkg),
        "sglang": _dist_version("sglang"),
    }
    if release_root is not None:
        out["paths"] = paths(release_root, site_packages, interpreter or sys.executable)
    return out


OPS = {"check": check, "paths": paths}
