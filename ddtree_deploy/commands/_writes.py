"""What the commands that change a host share: progress lines (and visible waits) on stderr, and SIGTERM/SIGHUP
taken as Ctrl-C."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..console import Waiting, err
from ..errors import Interrupted


class _Progress:
    """The progress callback the write commands hand down: ``progress(message)`` prints one line; a stage that can
    last (a server start-up) runs under ``progress.waiting(label, detail=...)`` (console.Waiting: a spinner with
    the elapsed time and the last server log line, or plain lines every 10 s where stderr is not a terminal)."""

    def __call__(self, message: str) -> None:
        err.print(f"[dim]{message}[/dim]" if "[" not in message else message)

    def waiting(self, label: str, detail: Callable[[], str | None] | None = None) -> Waiting:
        return Waiting(label, detail=detail)


progress = _Progress()


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGHUP count as Ctrl-C for the write commands: the run is handed to the host, which settles it,
    and the command exits 130 saying what the host did. Outside a run there is nothing to settle."""
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("interrupted before anything on the host changed; nothing to undo") from None
    finally:
        for s, h in old.items():
            signal.signal(s, h)
