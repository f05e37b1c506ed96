"""How commands reach a host: the transports, found through one registry (like Fabric's runners table).

``TRANSPORTS`` maps a host file's ``connection`` value to the class that implements it, as ``"module:Class"``
(a module of this package, or a dotted module path); the class is imported only when a host of that kind is
connected, so paramiko loads only for SSH hosts. The host file's ``connection`` field accepts exactly the kinds
listed here, read when a file is loaded (``inventory.known_connection``; the JSON Schema gives them to editors as
``examples``, not an ``enum``, so it needs no change for a new kind), and tests/test_transport_contract.py runs
the transport contract against every one. A new transport is its module, one line here, and its
``tests/test_transport_<kind>.py`` (the host the contract suite runs it on, and its own checks).

``connect(host)`` and ``HostConnection(host)`` give the same thing: an unopened connection of the class the
host's ``connection`` names; use it as a context manager. The contract every class keeps is ``base``'s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: The host file's ``connection`` value -> ``"module:Class"`` (module relative to this package unless dotted).
TRANSPORTS: dict[str, str] = {
    "ssh": "ssh:SSHConnection",
    "local": "local:LocalConnection",
}

from .base import (CHUNK, STDERR_MAX, STDOUT_MAX, Capture, HostConnection, RemoteSession,  # noqa: E402
                   RunResult, SessionChannel, StreamReader, output_overflow, parse_reply, pump_stdin, short)

if TYPE_CHECKING:
    from ..inventory import Host

__all__ = ["TRANSPORTS", "register", "transport_class", "connect", "CHUNK", "STDERR_MAX", "STDOUT_MAX", "Capture",
           "HostConnection", "RemoteSession", "RunResult", "SessionChannel", "StreamReader", "output_overflow",
           "parse_reply", "pump_stdin", "short"]


def register(kind: str, target: str) -> None:
    """Add (or replace) the transport for ``connection: <kind>``: ``target`` is ``"module:Class"``. Host files
    accept the kind from then on (the inventory reads the registry as it loads each file)."""
    if ":" not in target:
        raise ValueError(f"transport {kind!r}: expected 'module:Class', got {target!r}")
    TRANSPORTS[kind] = target


def transport_class(kind: str) -> type[HostConnection]:
    """The class for ``connection: <kind>``, imported on first use."""
    try:
        target = TRANSPORTS[kind]
    except KeyError:
        raise ValueError(f"unknown connection {kind!r} (known: {', '.join(TRANSPORTS)})") from None
    module, _, name = target.partition(":")
    mod = importlib.import_module(module if "." in module else f"{__name__}.{module}")
    cls = getattr(mod, name)
    if not (isinstance(cls, type) and issubclass(cls, HostConnection)):
        raise TypeError(f"transport {kind!r}: {target} is not a HostConnection")
    return cls


def connect(host: Host) -> HostConnection:
    """An unopened connection to ``host``, of the class its ``connection`` names (use it as a context manager)."""
    return transport_class(getattr(host, "connection", "ssh"))(host)
