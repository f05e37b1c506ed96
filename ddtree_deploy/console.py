"""Shared console output: rich tables for people, JSON for scripts (``--json`` on every read command)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.markup import escape
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


class _ConsoleHandler(logging.Handler):
    """Log records on stderr: ``warning: ...`` for warnings (what a user must see), dim timestamped lines for the
    debug log that ``-v`` turns on."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = escape(record.getMessage())
            if record.exc_info and record.levelno >= logging.ERROR:
                message += "\n" + escape(logging.Formatter().formatException(record.exc_info))
            if record.levelno >= logging.WARNING:
                level = "warning" if record.levelno == logging.WARNING else "error"
                err.print(f"[yellow]{level}:[/yellow] {message}", highlight=False, soft_wrap=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
                err.print(f"[dim]{stamp} {record.name}: {message}[/dim]", highlight=False, soft_wrap=True)
        except Exception:  # logging must never take the command down
            self.handleError(record)


def setup_logging(verbosity: int) -> None:
    """``-v``: ddtree-deploy's debug log on stderr (connections, commands and their timings, paths chosen);
    ``-vv``: the SSH library's as well. Without ``-v`` only warnings are shown (paramiko's never: every SSH
    failure is reported by the transport in one line)."""
    root = logging.getLogger()
    root.handlers[:] = [_ConsoleHandler()]
    root.setLevel(logging.WARNING)
    logging.getLogger("ddtree_deploy").setLevel(logging.DEBUG if verbosity >= 1 else logging.WARNING)
    for noisy in ("paramiko", "fabric", "invoke"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbosity >= 2 else logging.CRITICAL + 1)
