"""A copy of the sandbox's base host under a name, release root and server port of its own (same sshd, same SGLang),
so a CLI test can deploy and restart on it without touching what the other tests use."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_doc(source: str | Path, name: str, release_root: str) -> dict[str, Any]:
    """A sandbox host's file as a dict, renamed, with its own release root and a free server port."""
    doc = yaml.safe_load(Path(source).read_text())
    doc.update(name=name, release_root=release_root)
    doc["server"]["port"] = free_port()
    return doc


def base_host_doc(sandbox: Any, name: str, release_root: str) -> dict[str, Any]:
    """The base host's file as a dict, renamed, with its own release root and a free server port."""
    return host_doc(sandbox.base.source, name, release_root)


def new_inventory(tmp_path_factory: Any, label: str) -> tuple[Path, Path]:
    """A fresh directory for one test module (``root``) and an empty inventory in it (``root/hosts``)."""
    root = tmp_path_factory.mktemp(label)
    inv = root / "hosts"
    inv.mkdir()
    return root, inv
