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
from .hoststate import HostLayout
from .inventory import Host, server_setting
from .transport import HostConnection

DROPIN_NAME = "50-ddtree.conf"


def server_kind(host: Host) -> str:
    return server_setting(host, "kind")


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
    template = server_setting(host, "command")
    values = {
        "python": shlex.quote(host.python),
        "host": shlex.quote(str(server_setting(host, "host"))),
        "port": str(server_setting(host, "port")),
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


def become_prefix(host: Host) -> str:
    """The host file's ``server.become`` as a command prefix: "sudo" and "doas" run non-interactively (-n, so a
    password prompt is a clear error, never a hang); an absolute command is used as written."""
    become = str(host.server.get("become") or "").strip()
    if become in ("sudo", "doas"):
        return f"{become} -n"
    return become


def render_dropin(host: Host, *, ddtree: bool = True) -> str:
    """The systemd drop-in that makes the unit import the active release first, with DDTree on or off.

    Environment values are quoted for systemd (double quotes, backslash and quote escaped). The host file's DDTree
    flags reach the unit two ways: always as ``DDTREE_FLAGS`` (a unit whose ExecStart ends in ``$DDTREE_FLAGS`` gets
    them), and, when the host file gives ``server.command``, as an ExecStart that replaces the unit's own (with the
    flags, or without them for a baseline with DDTree off).
    """
    current = HostLayout.of(host).current
    flags = str(host.server.get("ddtree_flags", "")) if ddtree else ""
    env = {"PYTHONPATH": current, **server_env(host), "DDTREE_FLAGS": flags}
    lines = ["# Written by ddtree-deploy: the server imports sglang from the active overlay release.",
             "# Remove this file and run `systemctl daemon-reload` to go back to the installed package.",
             "[Service]"]
    for key, value in env.items():
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'Environment="{key}={escaped}"')
    if host.server.get("command"):
        lines += ["ExecStart=", "ExecStart=" + launch_command(host, ddtree=ddtree).replace("%", "%%")]
    return "\n".join(lines) + "\n"


def server_spec(host: Host) -> dict[str, Any]:
    """What the host needs to start, stop and restart its server by itself (remote/server.py ``control``): used by
    every server step of a run and by the host's guardian when it rolls a run back on its own."""
    kind = server_kind(host)
    spec: dict[str, Any] = {"kind": kind, "stop_timeout": float(server_setting(host, "stop_timeout")),
                            "port": int(server_setting(host, "port")), "env": server_env(host)}
    if kind == "systemd":
        spec.update(unit=host.server["unit"], unit_dir=str(host.server.get("unit_dir") or "/etc/systemd/system"),
                    become=become_prefix(host), dropin_on=render_dropin(host, ddtree=True),
                    dropin_off=render_dropin(host, ddtree=False))
    elif kind == "managed":
        spec.update(command_on=launch_command(host, ddtree=True), command_off=launch_command(host, ddtree=False))
    return spec


@dataclass
class ServerPaths:
    log: str
    pid_file: str


def managed_paths(host: Host) -> ServerPaths:
    layout = HostLayout.of(host)
    return ServerPaths(layout.server_log, layout.server_pid)


class ServerControl:
    """The server of one host, over an open connection. One remote call per operation.

    ``fence``: the run id when the caller holds the host lock; every start/stop/restart is then a step of that run
    (refused by the host once the run lost its lock, and recorded so an interrupted run restarts the server on the
    last good release)."""

    def __init__(self, conn: HostConnection, fence: str | None = None, host: Host | None = None) -> None:
        self.conn = conn
        self.host = host or conn.host  # ``host``: a variant of the connection's host (other DDTree flags; bench, tune)
        self.fence = fence

    def _call(self, op: str, **args: Any) -> Any:
        return self.conn.call("server", op, **args)

    @property
    def kind(self) -> str:
        return server_kind(self.host)

    def _act(self, action: str, release: str | None, ddtree: bool) -> dict[str, Any]:
        require_server(self.host)
        spec = server_spec(self.host)
        timeout = spec["stop_timeout"] + 60
        return self.conn.call("release", "server_action", timeout=timeout, root=self.host.release_root, spec=spec,
                              action=action, release=release, ddtree=ddtree, fence=self.fence)

    def start(self, *, release: str | None = None, ddtree: bool = True) -> dict[str, Any]:
        return self._act("start", release, ddtree)

    def stop(self) -> dict[str, Any]:
        return self._act("stop", None, False)

    def restart(self, *, release: str | None = None, ddtree: bool = True) -> dict[str, Any]:
        return self._act("restart", release, ddtree)

    def status(self, lines: int = 0) -> dict[str, Any]:
        require_server(self.host)
        if self.kind == "systemd":
            return self._call("systemd_status", unit=self.host.server["unit"], lines=lines, become=become_prefix(self.host))
        return self._call("status", root=self.host.release_root, lines=lines, port=int(server_setting(self.host, "port")))

    def launch(self) -> dict[str, Any] | None:
        """What the running server was started with (remote/server.py ``launch``): None when not recorded."""
        return self._call("launch", root=self.host.release_root)

    def logs(self, lines: int = 100, previous: bool = False) -> dict[str, Any]:
        require_server(self.host)
        if self.kind == "systemd":
            return self._call("systemd_logs", unit=self.host.server["unit"], lines=lines, become=become_prefix(self.host))
        return self._call("logs", root=self.host.release_root, lines=lines, previous=previous)

    def install_dropin(self, unit_dir: str | None = None, reload: bool = True, *, ddtree: bool = True) -> dict[str, Any]:
        unit_dir = unit_dir or str(self.host.server.get("unit_dir") or "/etc/systemd/system")
        return self._call("systemd_dropin", unit=self.host.server["unit"], content=render_dropin(self.host, ddtree=ddtree),
                          unit_dir=unit_dir, reload=reload, become=become_prefix(self.host))

    def describe(self, action: str, *, release: str | None, ddtree: bool) -> str:
        """What ``action`` would do, for --dry-run: the command or unit, the release, DDTree on or off."""
        where = f"release {release}" if release else "the installed package"
        mode = "DDTree on" if ddtree else "DDTree off"
        if self.kind == "systemd":
            via = f" via `{become_prefix(self.host)}`" if become_prefix(self.host) else ""
            drop = posixpath.join(str(self.host.server.get("unit_dir") or "/etc/systemd/system"),
                                  self.host.server["unit"] + ".d", DROPIN_NAME)
            if action == "stop":
                return f"systemctl stop {self.host.server['unit']}{via}"
            return f"write {drop} ({mode}), systemctl daemon-reload, systemctl {action} {self.host.server['unit']}{via}, on {where}"
        if action == "stop":
            return f"stop the managed server (SIGTERM, SIGKILL after {self.host.server.get('stop_timeout', 20.0)} s)"
        return f"{action} `{launch_command(self.host, ddtree=ddtree)}` with PYTHONPATH={self.host.release_root}/current, on {where} ({mode})"
