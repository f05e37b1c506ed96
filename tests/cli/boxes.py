"""A sandbox host under a name, release root and server port of its own (same sshd, same SGLang), for CLI tests
that deploy and restart servers without changing what the other tests use."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_copy(base_source: str, name: str, release_root: str) -> dict[str, Any]:
    """The base host's file as a document, renamed, with its own release root and a free server port."""
    doc = yaml.safe_load(Path(base_source).read_text())
    doc.update(name=name, release_root=release_root)
    doc["server"]["port"] = free_port()
    return doc
