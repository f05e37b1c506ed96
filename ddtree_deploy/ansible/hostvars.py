"""A host file as Ansible inventory variables: how Ansible's ssh (or local) connection reaches the host the way
ddtree-deploy does (address, port, user, key, the host file's known_hosts with strict checking), and the host's
Python as the interpreter the modules run under. Shared by the inventory plugin and ``apply --engine ansible``."""

from __future__ import annotations

import shlex
from typing import Any

from ..inventory import Host


def host_vars(host: Host) -> dict[str, Any]:
    out: dict[str, Any] = {"ansible_python_interpreter": host.python, "ddtree_host_file": host.source,
                           "ddtree_release_root": host.release_root}
    if host.connection == "local":
        out["ansible_connection"] = "local"
        return out
    out["ansible_connection"] = "ssh"
    out["ansible_host"] = host.ssh_alias or host.address or host.name
    if host.port:
        out["ansible_port"] = host.port
    if host.user:
        out["ansible_user"] = host.user
    if host.identity_file:
        out["ansible_ssh_private_key_file"] = host.identity_file
    args = ["-o", f"UserKnownHostsFile={host.known_hosts}",
            "-o", "StrictHostKeyChecking=" + ("accept-new" if host.trust_on_first_use else "yes"),
            "-o", f"ConnectTimeout={int(max(1, host.connect_timeout))}"]
    if host.ssh_config:
        args += ["-F", host.ssh_config]
    if not host.ssh_agent:
        args += ["-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none"]
    out["ansible_ssh_common_args"] = " ".join(shlex.quote(a) for a in args)
    return out


def inventory_doc(hosts: list[Host], groups: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """An Ansible YAML inventory of ``hosts`` (what ``apply --engine ansible`` hands ansible-runner)."""
    names = {h.name for h in hosts}
    children = {g: {"hosts": {m: None for m in members if m in names}} for g, members in (groups or {}).items()}
    return {"all": {"hosts": {h.name: host_vars(h) for h in hosts},
                    "children": {g: c for g, c in children.items() if c["hosts"]}}}
