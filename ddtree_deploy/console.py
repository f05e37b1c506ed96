"""Shared console output: rich tables for people, JSON for scripts (``--json`` on every read command)."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.errors import MarkupError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

out = Console()
err = Console(stderr=True)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


#: ``-o wide`` / ``--wide``: tables at their natural width, never wrapped or re-laid out (a pipe into ``less -S``).
_wide = False

#: A prose word longer than this may be folded rather than force the key-value layout (a long path in a message).
_LONGEST_WHOLE_WORD = 40
_NUMBER = re.compile(r"^[-+]?(\d[\d,]*)?\.?\d+(e[-+]?\d+)?\s*(%|x|s|ms|MB|GB|KiB|MiB|GiB)?$", re.I)


def set_wide(on: bool = True) -> None:
    """Tables at their full width: the console no longer wraps at the terminal's columns."""
    global _wide
    _wide = on  # off: the width stays what the console found (a run in-process may have set it)
    if on:
        out.width = 100_000


def take_wide_flag(args: list[str]) -> list[str]:
    """Remove ``--wide`` / ``-o wide`` / ``-owide`` wherever it stands (before ``--``), turning wide tables on (off
    without it); the rest of the arguments, in order. Like ``-v``, it is global."""
    end = args.index("--") if "--" in args else len(args)
    head, found, i = [], False, 0
    while i < end:
        a = args[i]
        if a in ("--wide", "-owide"):
            found = True
        elif a == "-o" and i + 1 < end and args[i + 1] == "wide":
            found, i = True, i + 1
        else:
            head.append(a)
        i += 1
    set_wide(found)
    return head + args[end:]


def _plain(cell: str) -> str:
    try:
        return Text.from_markup(cell).plain
    except MarkupError:
        return cell


class FitTable:
    """A table that keeps ids and numbers whole, whatever the terminal's width (the one rule for every table).

    Each column is laid out by what it holds: a column of numbers (``1569.41``, ``2.10x``, ``12 MB``) is
    right-aligned and never broken; a column of single tokens (ids, versions, host names, ``torch==2.9.1``) is
    never broken; a column of prose wraps between words and never splits one (only a word longer than 40
    characters, a path in a message, may be folded). When the whole columns do not fit the width, each row is
    printed as ``key  value`` lines instead (nothing is cut, nothing split mid-token); ``-o wide`` prints the
    table at its natural width. Cells are rich markup, as with ``rich.table.Table``.
    """

    def __init__(self, title: str, columns: Sequence[str], *, show_lines: bool = False) -> None:
        self.title = title
        self.columns = list(columns)
        self.show_lines = show_lines
        self.rows: list[tuple[list[str], str | None]] = []

    def add_row(self, *cells: Any, style: str | None = None) -> None:
        self.rows.append((["" if v is None else str(v) for v in cells], style))

    # -- layout ----------------------------------------------------------------------------------------------------
    def _kinds(self) -> list[str]:
        kinds = []
        for i in range(len(self.columns)):
            cells = [_plain(r[0][i]) for r in self.rows if i < len(r[0]) and r[0][i] not in ("", "-")]
            if cells and all(_NUMBER.match(c.strip()) for c in cells):
                kinds.append("number")
            elif all(not any(ch.isspace() for ch in c.strip()) for c in cells):
                kinds.append("token")
            else:
                kinds.append("prose")
        return kinds

    def _min_widths(self, kinds: list[str]) -> list[int]:
        widths = []
        for i, (name, kind) in enumerate(zip(self.columns, kinds, strict=True)):
            # a prose header wraps between words; a whole column's header is not wrapped either (rich's no_wrap)
            need = max(cell_len(w) for w in name.split() or [""]) if kind == "prose" else cell_len(name)
            for cells, _ in self.rows:
                text = _plain(cells[i]) if i < len(cells) else ""
                for line in text.splitlines() or [""]:
                    if kind == "prose":
                        need = max([need] + [min(cell_len(w), _LONGEST_WHOLE_WORD) for w in line.split()])
                    else:
                        need = max(need, cell_len(line.strip()))
            widths.append(need)
        return widths

    def _natural_widths(self) -> list[int]:
        """Each column's width with nothing wrapped: its longest line, header included."""
        widths = []
        for i, name in enumerate(self.columns):
            lines = [line for cells, _ in self.rows for line in (_plain(cells[i]) if i < len(cells) else "").splitlines()]
            widths.append(max([cell_len(name)] + [cell_len(line) for line in lines]))
        return widths

    def _widths(self, kinds: list[str], room: int) -> list[int]:
        """Every column at least its minimum (whole columns whole, prose its longest word); what room is left goes
        to the prose columns in proportion to what they lack. Fixed here, so rich never shrinks a column further."""
        mins, natural = self._min_widths(kinds), self._natural_widths()
        widths = list(mins)
        lack = [max(0, n - m) for n, m in zip(natural, mins, strict=True)]
        spare = room - sum(mins)
        if sum(lack) <= spare:
            return [max(n, m) for n, m in zip(natural, mins, strict=True)]
        for i, want in enumerate(lack):
            widths[i] += spare * want // sum(lack)
        for i in sorted(range(len(lack)), key=lambda j: -lack[j])[:room - sum(widths)]:
            widths[i] += 1
        return widths

    def _table(self, kinds: list[str], widths: list[int] | None) -> Table:
        t = Table(title=self.title, title_justify="left", header_style="bold", show_lines=self.show_lines)
        for i, (name, kind) in enumerate(zip(self.columns, kinds, strict=True)):
            width = widths[i] if widths else None
            if kind == "prose" and widths:
                t.add_column(name, overflow="fold", width=width)
            else:
                t.add_column(name, no_wrap=True, overflow="fold", width=width,
                             justify="right" if kind == "number" else "left")
        for cells, style in self.rows:
            t.add_row(*cells, style=style)
        return t

    def _key_values(self) -> Group:
        parts: list[Any] = [Text(self.title, style="italic")] if self.title else []
        for n, (cells, style) in enumerate(self.rows):
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column(overflow="fold")
            for name, cell in zip(self.columns, cells, strict=False):
                if cell != "":
                    grid.add_row(escape(name), cell, style=style)
            if n:
                parts.append(Text(""))
            parts.append(grid)
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        kinds = self._kinds()
        if _wide:
            yield self._table(kinds, None)
            return
        room = options.max_width - (3 * len(self.columns) + 1)  # borders and padding
        if sum(self._min_widths(kinds)) <= room:
            yield self._table(kinds, self._widths(kinds, room))
        else:
            yield self._key_values()


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, show_lines: bool = False) -> FitTable:
    """Every command's table (see :class:`FitTable` for the layout rule)."""
    t = FitTable(title, columns, show_lines=show_lines)
    for row in rows:
        t.add_row(*row)
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


def fold_help_text() -> None:
    """Help texts fold a long word (a default path) onto the next line instead of cutting it with '…'.

    typer's rich help puts each option's help into a column that ends a word too long for it with an ellipsis,
    so at 80 columns ``~/.local/state/ddtree-deploy/sandbox`` became ``~/.local/state/ddtree-deploy…``; typer has
    no setting for it, so its help builder is wrapped (only the overflow of the Text items changes). Without that
    private function (another typer) help is left as typer renders it."""
    from typer import rich_utils

    build = getattr(rich_utils, "_get_parameter_help", None)
    if build is None or getattr(build, "_ddtree_folds", False):
        return

    def folding(*args: Any, **kwargs: Any) -> Any:
        columns = build(*args, **kwargs)
        for item in getattr(columns, "renderables", ()):
            if isinstance(item, Text):
                item.overflow = "fold"
        return columns

    folding._ddtree_folds = True  # type: ignore[attr-defined]
    rich_utils._get_parameter_help = folding


class Waiting:
    """A wait a person can see: after ``show_after`` seconds, a spinner on stderr with the elapsed time and
    ``detail()`` (e.g. the server log's last line), refreshed every ``poll`` seconds; where stderr is not a
    terminal (CI, a pipe, a log file), one plain line every ``every`` seconds instead (label, elapsed, detail).
    Nothing goes to stdout, so ``--json`` output is untouched. ``detail`` runs in the ticker thread; an exception
    there only drops the detail (a wait is never failed by its display)."""

    def __init__(self, label: str, *, detail: Callable[[], str | None] | None = None, detail_name: str = "last log line",
                 show_after: float = 2.0, every: float = 10.0, poll: float = 2.0, console: Console | None = None) -> None:
        self.label, self.detail_fn, self.detail_name = label, detail, detail_name
        self.show_after, self.every, self.poll = show_after, every, poll
        self.console = console or err
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._detail: str | None = None

    def _read_detail(self) -> None:
        if self.detail_fn is None:
            return
        try:
            text = self.detail_fn()
        except Exception as exc:  # the display must never fail the wait
            logging.getLogger("ddtree_deploy.console").debug("%s: progress detail failed: %s", self.label, exc)
            return
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        if lines:
            self._detail = lines[-1][:200]

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        tail = f"; {self.detail_name}: {self._detail}" if self._detail else ""
        return f"{self.label}: {elapsed:.0f} s elapsed{tail}"

    def _run(self) -> None:
        if self._stop.wait(self.show_after):
            return
        if self.console.is_terminal:
            status = self.console.status(escape(self.line()), spinner="dots")
            status.start()
            try:
                last_read = 0.0
                while not self._stop.is_set():
                    if time.monotonic() - last_read >= self.poll:
                        self._read_detail()
                        last_read = time.monotonic()
                    status.update(escape(self.line()))
                    self._stop.wait(0.25)
            finally:
                status.stop()
            return
        while True:
            self._read_detail()
            if self._stop.is_set():
                return
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> "Waiting":
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="waiting", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a detail read stuck on a dying link must not hold the command
