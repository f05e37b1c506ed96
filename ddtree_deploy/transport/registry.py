"""The transport registry: a host file's ``connection`` value -> the class that implements it, as ``"module:Class"``
(a module of :mod:`ddtree_deploy.transport`, or a dotted module path). Pure data and one function, importing no
transport, so the inventory can read the kinds it accepts without importing what implements them (no import circle:
the transports' own modules name the inventory's ``Host`` in their types)."""

from __future__ import annotations

#: The host file's ``connection`` value -> ``"module:Class"`` (module relative to the transport package unless dotted).
TRANSPORTS: dict[str, str] = {
    "ssh": "ssh:SSHConnection",
    "local": "local:LocalConnection",
}


def register(kind: str, target: str) -> None:
    """Add (or replace) the transport for ``connection: <kind>``: ``target`` is ``"module:Class"``. Host files
    accept the kind from then on (the inventory reads the registry as it loads each file)."""
    if ":" not in target:
        raise ValueError(f"transport {kind!r}: expected 'module:Class', got {target!r}")
    TRANSPORTS[kind] = target
