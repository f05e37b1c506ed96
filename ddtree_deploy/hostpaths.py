"""The host file's paths as the host resolves them: what a write into the release root really reaches.

``inventory`` checks ``release_root`` against ``site_packages`` as text. The host decides where a write lands: a
venv's own ``lib64 -> lib``, a symlink anywhere on the way, ``..`` after a symlink, or a symlink among the release
root's entries can put a "release root" inside site-packages or the installed package, and a release would then be
written into it (or the package copied into itself). ``check(conn, host)`` asks the host to resolve
``release_root``, ``site_packages``, the package and ``python`` with ``realpath`` (``remote/hostinfo.py`` ``paths``)
and refuses, with both spellings shown, a root that resolves inside site-packages or the package, or that holds a
symlink leading there. ``hosts check``, ``snapshot`` and every write command (before the lock, so before anything
is written) run it.
"""

from __future__ import annotations

from typing import Any

from .errors import InputError
from .inventory import Host, release_root_problems


def resolve(conn: Any, host: Host) -> dict[str, Any]:
    """The host's answer (one round trip): each path resolved, and the symlinks of the release root."""
    return conn.call("hostinfo", "paths", release_root=host.release_root, site_packages=host.site_packages,
                     interpreter=host.python, timeout=max(30.0, host.connect_timeout * 3))


def problems(host: Host, resolved: dict[str, Any]) -> list[str]:
    """What is wrong with the host file's paths as the host resolves them, each naming the field and both
    spellings (empty when nothing is)."""
    site, package, root = resolved["site_packages"], resolved["package"], resolved["release_root"]

    def spelled(given: str, real: str) -> str:
        return repr(given) if given.rstrip("/") == real else f"{given!r} (resolved on the host: {real!r})"

    where = f"site-packages at {spelled(host.site_packages, site)}, the installed package at {package!r}"
    out = []
    if release_root_problems(root, site, package):
        out.append(f"field 'release_root': {spelled(host.release_root, root)} resolves inside site-packages or the "
                   f"installed package ({where}); releases would be written into it")
    for name, target in sorted(resolved["links"].items()):
        if release_root_problems(target, site, package):
            out.append(f"field 'release_root': {spelled(host.release_root, root)}: its entry {name!r} is a symlink to "
                       f"{target!r}, inside site-packages or the installed package ({where}); a write through it "
                       "would land there")
    return out


def check(conn: Any, host: Host, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """Refuse (InputError, exit 2, naming the host file) a release root that resolves into site-packages or the
    package; returns the resolved paths."""
    resolved = resolved if resolved is not None else resolve(conn, host)
    found = problems(host, resolved)
    if found:
        raise InputError(f"{host.source}: host {host.name}: " + "; ".join(found) + "; nothing was written",
                         hint="give release_root a directory of its own outside the Python environment, "
                              "e.g. /opt/ddtree (`ddtree-deploy hosts check` shows how the host resolves each path)")
    return resolved
