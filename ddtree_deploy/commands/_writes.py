"""What the commands that change a host share: progress lines on stderr, and SIGTERM/SIGHUP taken as Ctrl-C."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Iterator

from ..console import err
from ..errors import Interrupted


def progress(message: str) -> None:
    err.print(f"[dim]{message}[/dim]" if "[" not in message else message)


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
