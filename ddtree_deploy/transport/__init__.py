"""How commands reach a host: the transports, found through one registry (like Fabric's runners table).

``TRANSPORTS`` (in :mod:`.registry`, which imports no transport) maps a host file's ``connection`` value to the class
that implements it, as ``"module:Class"`` (a module of this package, or a dotted module path); the class is imported
only when a host of that kind is
connected, so paramiko loads only for SSH hosts. The host file's ``connection`` field accepts exactly the kinds
listed here, read when a file is loaded (``inventory.known_connection``; the JSON Schema gives them to editors as
``examples``, not an ``enum``, so it needs no change for a new kind), and tests/test_transport_contract.py runs
the transport contract against every one. A new transport is its module, one line in ``registry.py``, and its
``tests/test_transport_<kind>.py`` (the host the contract suite runs it on, and its own checks).

``connect(host)`` and ``HostConnection(host)`` give the same thing: an unopened connection of the class the
host's ``connection`` names; use it as a context manager. The contract every class keeps is ``base``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (CHUNK, STDERR_MAX, STDOUT_MAX, Capture, HostConnection, RemoteSession, RunResult, SessionChannel,
                   StreamReader, output_overflow, parse_reply, pump_stdin, short, transport_class)
from .registry import TRANSPORTS, register

if TYPE_CHECKING:
    from ..inventory import Host

__all__ = ["TRANSPORTS", "register", "transport_class", "connect", "CHUNK", "STDERR_MAX", "STDOUT_MAX", "Capture",
           "HostConnection", "RemoteSession", "RunResult", "SessionChannel", "StreamReader", "output_overflow",
           "parse_reply", "pump_stdin", "short"]


def connect(host: Host) -> HostConnection:
    """An unopened connection to ``host``, of the class its ``connection`` names (use it as a context manager)."""
    return transport_class(getattr(host, "connection", "ssh"))(host)
