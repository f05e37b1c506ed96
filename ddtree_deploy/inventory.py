"""Host inventory: one YAML file per host under ``hosts/``, validated into a frozen ``Host``.

Everything later in the flow (transport, snapshot, release, server, probe) reads hosts from here and nowhere
else, so a typo is caught once, with the file and field named, before any host is touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError
from .schema import Field, absolute_path, become_command, non_negative, port_range, positive, validate

#: How SGLang (or the sandbox's reference engine) runs on the host. See docs in hosts/ct129.yaml.
SERVER_SCHEMA: dict[str, Field] = {
    "kind": Field("str", default="none", choices=("none", "managed", "systemd"),
                  help="how the server runs: a managed process, a systemd unit, or none"),
    "command": Field("str", default="", help="launch command template; {python}, {port}, {host}, {release_root}, {ddtree_flags}"),
    "ddtree_flags": Field("str", default="", help="flags that turn DDTree on, substituted for {ddtree_flags}"),
    "host": Field("str", default="127.0.0.1", help="address the server listens on, as seen from the host"),
    "port": Field("int", default=30000, check=port_range),
    "env": Field("str-map", default=dict, help="extra environment for the server"),
    "unit": Field("str", default="", help="systemd unit name (kind: systemd)"),
    "unit_dir": Field("str", default="/etc/systemd/system", check=absolute_path,
                      help="where the unit's drop-in directory lives (kind: systemd)"),
    "become": Field("str", default="", check=become_command,
                    help="privilege escalation for the drop-in, systemctl and journalctl: sudo or doas (run with -n), "
                         "or an absolute command prefix"),
    "stop_timeout": Field("float", default=20.0, check=positive),
}

#: How the probe judges a freshly started server.
PROBE_SCHEMA: dict[str, Field] = {
    "startup_timeout": Field("float", default=600.0, check=positive, help="seconds for /health to answer 200"),
    "startup_stall_timeout": Field("float", default=300.0, check=non_negative,
                                   help="fail start-up once the server log is silent and /health failing this long (0: off)"),
    "overlay_timeout": Field("float", default=60.0, check=positive),
    "selftest_timeout": Field("float", default=120.0, check=positive),
    "generation_timeout": Field("float", default=120.0, check=positive),
    "health_path": Field("str", default="/health"),
    "prompts": Field("list", default=list, items=Field("str")),
    "max_new_tokens": Field("int", default=32, check=positive),
    "min_accept_length": Field("float", default=0.0),
}

HOST_SCHEMA: dict[str, Field] = {
    "name": Field("str", help="host name; defaults to the file name"),
    "description": Field("str", default=""),
    "address": Field("str", help="DNS name or IP; or give ssh_alias"),
    "ssh_alias": Field("str", help="a Host entry of the ssh_config file (honours HostName, Port, User, ProxyJump)"),
    "ssh_config": Field("str", help="ssh_config file to read instead of ~/.ssh/config"),
    "user": Field("str", default=None),
    "port": Field("int", default=None, check=port_range),
    "identity_file": Field("str", default=None),
    "known_hosts": Field("str", default="~/.ssh/known_hosts", help="known_hosts file checked strictly"),
    "trust_on_first_use": Field("bool", default=False, help="accept and record an unknown key once (never a changed one)"),
    "connect_timeout": Field("float", default=10.0, check=positive),
    "command_timeout": Field("float", default=600.0, check=positive),
    "python": Field("str", required=True, check=absolute_path, help="the interpreter SGLang runs under"),
    "site_packages": Field("str", required=True, check=absolute_path, help="site-packages holding the installed sglang"),
    "release_root": Field("str", required=True, check=absolute_path, help="where overlay releases live"),
    "keep_releases": Field("int", default=5, check=positive),
    "sandbox": Field("bool", default=False, help="written by `ddtree-deploy sandbox up`"),
    "server": Field("mapping", fields=SERVER_SCHEMA),
    "probe": Field("mapping", fields=PROBE_SCHEMA),
}


@dataclass(frozen=True)
class Host:
    """A validated host: how to reach it and where SGLang lives on it."""

    name: str
    source: str
    python: str
    site_packages: str
    release_root: str
    address: str | None = None
    ssh_alias: str | None = None
    ssh_config: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    trust_on_first_use: bool = False
    connect_timeout: float = 10.0
    command_timeout: float = 600.0
    keep_releases: int = 5
    description: str = ""
    sandbox: bool = False
    server: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """What we hand to ssh: the alias when there is one, else the address."""
        return self.ssh_alias or self.address or self.name

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "user": self.user,
            "port": self.port,
            "python": self.python,
            "site_packages": self.site_packages,
            "release_root": self.release_root,
            "server": self.server.get("kind", "none"),
            "file": self.source,
        }


def default_inventory_dir() -> Path:
    """``$DDTREE_INVENTORY`` if set, else ``./hosts``."""
    return Path(os.environ.get("DDTREE_INVENTORY", "hosts"))


def load_host_file(path: Path) -> Host:
    """Parse and validate one host file; every error names ``path`` and the field."""
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{source}: cannot read host file: {exc.strerror}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {exc}") from exc
    if doc is None:
        raise InputError(f"{source}: empty host file (expected a mapping with python, site_packages, release_root)")
    data = validate(doc, HOST_SCHEMA, source=source)
    if not data["address"] and not data["ssh_alias"]:
        raise InputError(f"{source}: missing required field 'address': expected a string (or give 'ssh_alias')")
    name = data.pop("name") or path.stem
    return Host(name=name, source=source, **data)


def load_inventory(directory: Path | None = None) -> dict[str, Host]:
    """All hosts of the inventory directory, by name. Duplicate names are an error naming both files."""
    directory = directory or default_inventory_dir()
    if not directory.is_dir():
        raise InputError(f"{directory}: inventory directory not found (set --inventory or DDTREE_INVENTORY)")
    hosts: dict[str, Host] = {}
    for path in sorted(directory.glob("*.yaml")):
        host = load_host_file(path)
        if host.name in hosts:
            raise InputError(f"{path}: host name '{host.name}' already defined in {hosts[host.name].source}")
        hosts[host.name] = host
    return hosts


def resolve_host(name: str, directory: Path | None = None) -> Host:
    """A host by name (or by the path of its YAML file)."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return load_host_file(candidate)
    hosts = load_inventory(directory)
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none"
        raise InputError(f"unknown host '{name}' (inventory {directory or default_inventory_dir()} has: {known})")
    return hosts[name]
