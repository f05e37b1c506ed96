"""Host files for the CLI tests: a sandbox host's file with fields changed, written into an inventory directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_host(inv: Path, host: Any, **changes: Any) -> Path:
    """``host``'s file (a validated Host: its ``source``) with ``changes`` (None removes a field), as
    ``inv/<name>.yaml``."""
    doc = yaml.safe_load(Path(host.source).read_text())
    doc.update(changes)
    doc = {k: v for k, v in doc.items() if v is not None}
    inv.mkdir(parents=True, exist_ok=True)
    path = inv / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
