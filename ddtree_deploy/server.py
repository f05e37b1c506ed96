"""Start, stop and inspect the SGLang server of a host, the way its host file's ``server`` section says.

Two kinds: ``managed`` (we start the launch command in its own session with ``PYTHONPATH=<release_root>/current``,
a pid file and a log under ``<release_root>/server/``) and ``systemd`` (we write a drop-in that sets the same
environment and drive the unit with systemctl). Either way the server sees the active release only through
``current``, so switching releases never touches the installed package and a restart picks up the switch.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Any

from .errors import InputError
from .inventory import Host
from .transport import HostConnection

DROPIN_NAME = "50-ddtree.conf"


def server_kind(host: Host) -> str:
    return host.server.get("kind", "none")


def require_server(host: Host) -> None:
    """Bad input, named: a host whose server section cannot be driven."""
    kind = server_kind(host)
    if kind == "none":
        raise InputError(f"{host.source}: field 'server.kind' is 'none': ddtree-deploy does not know how this host "
                         "runs SGLang (set kind: managed with a command, or kind: systemd with a unit)")
    if kind == "managed" and not host.server.get("command"):
        raise InputError(f"{host.source}: field 'server.command' is empty (needed for server.kind: managed)")
    if kind == "systemd" and not host.server.get("unit"):
        raise InputError(f"{host.source}: field 'server.unit' is empty (needed for server.kind: systemd)")


def launch_command(host: Host, *, ddtree: bool = True) -> str:
    """The host file's command template with its placeholders filled (values shell-quoted)."""
    srv = host.server
    template = srv.get("command", "")
    values = {
        "python": shlex.quote(host.python),
        "host": shlex.quote(str(srv.get("host", "127.0.0.1"))),
        "port": str(srv.get("port", 30000)),
        "release_root": shlex.quote(host.release_root),
        "ddtree_flags": srv.get("ddtree_flags", "") if ddtree else "",
    }
    try:
        return template.format(**values).strip()
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(f"{host.source}: field 'server.command': bad placeholder {exc} "
                         f"(known: {', '.join('{' + k + '}' for k in values)})") from exc


def server_env(host: Host) -> dict[str, str]:
    """The host file's extra environment; PYTHONPATH=<root>/current is added on the host (remote/server.py)."""
    return {k: str(v) for k, v in (host.server.get("env") or {}).items()}


def base_url(host: Host) -> str:
    srv = host.server
    addr = str(srv.get("host", "127.0.0.1"))
    if addr in ("0.0.0.0", "::", ""):
        addr = "127.0.0.1"
    return f"http://{addr}:{srv.get('port', 30000)}"


def render_dropin(host: Host) -> str:
    """The systemd drop-in that makes the unit import the active release first.

    Environment values are quoted for systemd (double quotes, backslash and quote escaped); the unit's own
    ExecStart is kept, so the host file's ``command`` is not used for systemd hosts.
    """
    current = posixpath.join(host.release_root, "current")
    env = {"PYTHONPATH": current, **server_env(host)}
    lines = ["# Written by ddtree-deploy: the server imports sglang from the active overlay release.",
             "# Remove this file and run `systemctl daemon-reload` to go back to the installed package.",
             "[Service]"]
    for key, value in env.items():
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'Environment="{key}={escaped}"')
    return "\n".join(lines) + "\n"


@dataclass
class ServerPaths:
    log: str
    pid_file: str


def managed_paths(host: Host) -> ServerPaths:
    d = posixpath.join(host.release_root, "server")
    return ServerPaths(posixpath.join(d, "server.log"), posixpath.join(d, "server.pid"))


class ServerControl:
    """The server of one host, over an open connection. One remote call per operation."""

    def __init__(self, conn: HostConnection) -> None:
        self.conn = conn
        self.host = conn.host

    def _call(self, op: str, **args: Any) -> Any:
        return self.conn.call("server", op, **args)

    @property
    def kind(self) -> str:
        return server_kind(self.host)

    def start(self, *, release: str | None = None, ddtree: bool = True) -> dict[str, Any]:
        require_server(self.host)
        if self.kind == "systemd":
            self.install_dropin()
            return self._call("systemd", unit=self.host.server["unit"], action="start")
        return self._call("start", root=self.host.release_root, command=launch_command(self.host, ddtree=ddtree),
                          env=server_env(self.host), release=release)

    def stop(self) -> dict[str, Any]:
        require_server(self.host)
        timeout = float(self.host.server.get("stop_timeout", 20.0))
        if self.kind == "systemd":
            return self._call("systemd", unit=self.host.server["unit"], action="stop")
        return self.conn.call("server", "stop", root=self.host.release_root, wait=timeout, timeout=timeout + 30)

    def restart(self, *, release: str | None = None, ddtree: bool = True) -> dict[str, Any]:
        require_server(self.host)
        if self.kind == "systemd":
            self.install_dropin()
            return self._call("systemd", unit=self.host.server["unit"], action="restart")
        timeout = float(self.host.server.get("stop_timeout", 20.0))
        return self.conn.call("server", "restart", root=self.host.release_root, wait=timeout, timeout=timeout + 30,
                              command=launch_command(self.host, ddtree=ddtree), env=server_env(self.host), release=release)

    def status(self, lines: int = 0) -> dict[str, Any]:
        require_server(self.host)
        if self.kind == "systemd":
            return self._call("systemd_status", unit=self.host.server["unit"], lines=lines)
        return self._call("status", root=self.host.release_root, lines=lines)

    def logs(self, lines: int = 100, previous: bool = False) -> dict[str, Any]:
        require_server(self.host)
        if self.kind == "systemd":
            return self._call("systemd_logs", unit=self.host.server["unit"], lines=lines)
        return self._call("logs", root=self.host.release_root, lines=lines, previous=previous)

    def install_dropin(self, unit_dir: str = "/etc/systemd/system", reload: bool = True) -> dict[str, Any]:
        return self._call("systemd_dropin", unit=self.host.server["unit"], content=render_dropin(self.host),
                          unit_dir=unit_dir, reload=reload)
