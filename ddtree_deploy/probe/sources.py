"""Where the probe and the host's guardian look on the host: the release's sglang directory, the server's pid and
log (a file for a managed server, the unit and its journal for systemd), and the guardian's start-up check."""

from __future__ import annotations

import posixpath
from typing import Any

from ..hoststate import HostLayout
from ..inventory import Host, probe_setting
from ..server import base_url, become_prefix, managed_paths, server_kind, server_spec

#: Where the DDTree runtime sits inside the sglang package of a release.
RUNTIME_SUBDIR = "srt/speculative/ddtree"


def expected_sglang_dir(host: Host, release: str | None) -> str:
    """The sglang directory the server must import: the release's, or the installed one (no release)."""
    if release is None:
        return posixpath.join(host.site_packages, "sglang")
    return HostLayout.of(host).release_package(release)


def pid_source(host: Host) -> dict[str, Any]:
    if server_kind(host) == "systemd":
        return {"kind": "systemd", "unit": host.server["unit"], "become": become_prefix(host)}
    return {"kind": "file", "path": managed_paths(host).pid_file}


def log_source(host: Host) -> dict[str, Any]:
    if server_kind(host) == "systemd":
        return {"kind": "journal", "unit": host.server["unit"], "since": "-15min", "become": become_prefix(host)}
    return {"kind": "file", "path": managed_paths(host).log}


def guard_spec(host: Host) -> dict[str, Any] | None:
    """What the host's guardian needs to put the server back on the last good release by itself and see it come
    up (release.Lease): the server spec plus the start-up check. None for a host whose server we do not drive."""
    if server_kind(host) == "none":
        return None
    return {**server_spec(host), "pid_source": pid_source(host), "log_source": log_source(host),
            "health_url": base_url(host) + str(probe_setting(host, "health_path")),
            "startup_timeout": float(probe_setting(host, "startup_timeout")), "stall": float(probe_setting(host, "startup_stall_timeout"))}
