"""Shared console output: rich tables for people, JSON for scripts (``--json`` on every read command)."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.table import Table

out = Console()
err = Console(stderr=True)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, column in enumerate(columns):
        t.add_column(column, no_wrap=(i == 0), overflow="fold")
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    return t
