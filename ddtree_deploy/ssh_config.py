"""ssh_config as OpenSSH reads it: which HostName, Port and User a host's ``ssh_alias`` (or address) stands for.

Where the OpenSSH client is installed, ``ssh -G TARGET`` (``-F FILE`` when the host file names its ssh_config)
answers: it is OpenSSH itself, so ``Include``, ``Match``, ``CanonicalizeHostname`` and every later addition are read
exactly as ``ssh`` would. Without the client, paramiko's parser reads the files, with their ``Include`` lines
expanded first (paramiko has no Include): good for Host blocks, not for ``Match exec``.

The SSH connection itself (transport.ssh) reads the same Include-expanded files through paramiko for what a
connection needs beyond the address (IdentityFile, ProxyJump hops), and takes HostName, Port and User from
``resolve`` when the host file does not set them; ``hosts list`` shows the same resolution. Nothing here imports
paramiko unless ``ssh`` is missing or a connection is opened, so local hosts never need it.
"""

from __future__ import annotations

import getpass
import glob
import logging
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:
    from .inventory import Host

log = logging.getLogger("ddtree_deploy.transport")

USER_CONFIG, SYSTEM_CONFIG = "~/.ssh/config", "/etc/ssh/ssh_config"
DEFAULT_SSH_CONFIGS = (USER_CONFIG, SYSTEM_CONFIG)
_INCLUDE = re.compile(r"^\s*include\s*[=\s]\s*(.+?)\s*$", re.IGNORECASE)
_HOST = re.compile(r"^\s*host\s*[=\s]\s*(.+?)\s*$", re.IGNORECASE)
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


@dataclass(frozen=True)
class Resolved:
    """Where a target really goes, and who said so (``ssh -G`` or ``paramiko``)."""

    hostname: str
    port: int
    user: str
    by: str


def config_files(host: "Host") -> list[str]:
    """The ssh_config files read for ``host``: its ``ssh_config`` alone, else ~/.ssh/config and the system file."""
    return [host.ssh_config] if host.ssh_config else list(DEFAULT_SSH_CONFIGS)


def expanded_text(files: tuple[str, ...] | list[str]) -> str:
    """The files' text, each ``Include`` replaced by the files it names (relative to ~/.ssh for the user's file and
    any file it includes, to /etc/ssh for the system file; globs sorted, missing files skipped, as OpenSSH does)."""
    out: list[str] = []
    for name in files:
        path = os.path.expanduser(name)
        system = os.path.abspath(path) == SYSTEM_CONFIG
        _expand(path, "/etc/ssh" if system else os.path.expanduser("~/.ssh"), 0, out)
    return "".join(out)


def _expand(path: str, base: str, depth: int, out: list[str]) -> None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return
    for line in lines:
        match = _INCLUDE.match(line)
        if not match:
            out.append(line if line.endswith("\n") else line + "\n")
            continue
        if depth >= _MAX_INCLUDE_DEPTH:
            raise InputError(f"{path}: Include nested more than {_MAX_INCLUDE_DEPTH} deep")
        for pattern in shlex.split(match.group(1)):
            pattern = os.path.expanduser(pattern)
            full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
            for included in sorted(glob.glob(full)):
                _expand(included, base, depth + 1, out)


def entries(files: list[str]) -> list[str]:
    """The Host patterns the files define (Include'd files too), without ``*`` and negations."""
    names: list[str] = []
    for line in expanded_text(files).splitlines():
        match = _HOST.match(line)
        if match:
            names += [p for p in match.group(1).split() if p != "*" and not p.startswith("!")]
    return sorted(set(names))


def paramiko_config(files: list[str]) -> Any:
    """A paramiko SSHConfig of the files with their Includes expanded (what Fabric is given to read)."""
    import paramiko

    return paramiko.SSHConfig.from_text(expanded_text(files))


def resolve(host: "Host") -> Resolved:
    """HostName, Port and User of the host as OpenSSH resolves its target (see the module docstring)."""
    return _resolve(host.target, host.ssh_config, host.port, host.user, host.source, shutil.which("ssh"))


@lru_cache(maxsize=256)
def _resolve(target: str, ssh_config: str | None, port: int | None, user: str | None, source: str,
             ssh: str | None) -> Resolved:
    files = [ssh_config] if ssh_config else list(DEFAULT_SSH_CONFIGS)
    if ssh is None:
        found = paramiko_config(files).lookup(target)
        return Resolved(str(found.get("hostname") or target), int(port or found.get("port") or 22),
                        user or str(found.get("user") or getpass.getuser()), "paramiko")
    argv = [ssh, "-G"]
    if ssh_config:
        argv += ["-F", os.path.expanduser(ssh_config)]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    try:
        proc = subprocess.run([*argv, "--", target], capture_output=True, text=True, timeout=15,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{source}: `ssh -G {target}` did not answer: {exc}") from exc
    if proc.returncode != 0:
        why = "; ".join(ln.strip() for ln in proc.stderr.strip().splitlines()) or f"ssh -G exited {proc.returncode}"
        shown = " ".join(shlex.quote(a) for a in [*argv[1:], target])
        raise InputError(f"{source}: ssh_config of {target!r} cannot be read: {why}",
                         hint=f"`ssh {shown}` shows what OpenSSH makes of it")
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key.lower(), value.strip())
    log.debug("ssh -G %s: hostname %s port %s user %s", target, values.get("hostname"), values.get("port"),
              values.get("user"))
    return Resolved(values.get("hostname") or target, int(values.get("port") or 22),
                    values.get("user") or getpass.getuser(), "ssh -G")
