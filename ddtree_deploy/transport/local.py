"""``connection: local``: the host is this machine, so commands run as local subprocesses (like Ansible's local
connection). Run ddtree-deploy on the GPU box itself, with no sshd, no keys and no SSH library installed.

Same contract as the SSH connection: the command runs through a shell in its own session (a timeout kills its
whole process group, as a dropped SSH session would end it), it gets the stdin we give it and never ours, stdout
and stderr are collected separately, and the remote helper programs speak the same reply protocol. A server the
helper starts detaches into its own session and may keep our pipes open: a command is done when its shell exits,
not when every pipe reaches EOF. The environment is ours minus ``PYTHONPATH``/``PYTHONHOME``, so the host's Python
imports what is installed (and the overlay the server is given), not what this process happened to have.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import IO, Iterable, Iterator

from ..errors import RemoteError, TransportError
from .base import (CHUNK, STDERR_MAX, STDOUT_MAX, Capture, HostConnection, RunResult, SessionChannel,
                        StreamReader, output_overflow, pump_stdin, short)

log = logging.getLogger("ddtree_deploy.transport")

SHELL = "/bin/sh"
#: Seconds the pipes may stay quiet after the shell exited before the command counts as done.
_QUIET_AFTER_EXIT = 0.05
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME")


def command_env() -> dict[str, str]:
    """The environment commands run with: ours, without what would change which Python packages get imported."""
    return {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}


class LocalConnection(HostConnection):
    """Runs every command of a ``connection: local`` host on this machine."""

    #: a child process with its stdin a pipe from us: EOF on the host when we close it or this process dies
    holds_session = True

    def open(self) -> None:
        log.debug("%s: local host (commands run here, through %s)", self.host.name, SHELL)

    def close(self) -> None:
        pass

    def _spawn(self, command: str, *, stdin: bool) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen([SHELL, "-c", command], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=command_env(), cwd="/",
                                    start_new_session=True)
        except OSError as exc:
            raise TransportError(self.host.name, f"cannot start {SHELL}: {exc.strerror}") from exc

    def _session_channel(self, command: str) -> SessionChannel:
        return _LocalSessionChannel(self._spawn(command, stdin=True))

    def run(self, command: str, *, stdin: bytes | Iterable[bytes] | None = None, timeout: float | None = None,
            check: bool = True) -> RunResult:
        timeout = timeout or self.host.command_timeout
        start = time.monotonic()
        deadline = start + timeout
        proc = self._spawn(command, stdin=stdin is not None)
        writer = pump_stdin(stdin, proc.stdin.write, proc.stdin.close) if stdin is not None else None  # type: ignore[union-attr]
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
        out, err = Capture(STDOUT_MAX), Capture(STDERR_MAX, tail=True)
        captures = {out_fd: out, err_fd: err}
        sel = selectors.DefaultSelector()
        for fd in captures:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    raise TransportError(self.host.name, f"command timed out after {timeout:g} s: {short(command)}")
                events = sel.select(timeout=_QUIET_AFTER_EXIT)
                for key, _ in events:
                    try:
                        data = os.read(key.fd, CHUNK)
                    except BlockingIOError:
                        continue
                    if not data:
                        sel.unregister(key.fd)
                    elif not captures[key.fd].add(data):
                        _kill_group(proc)
                        raise output_overflow(self.host.name, short(command))
                if not events and proc.poll() is not None:
                    break  # the shell is gone and its pipes are quiet (a detached server may hold them open)
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            raise TransportError(self.host.name, f"command timed out after {timeout:g} s: {short(command)}") from exc
        finally:
            sel.close()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            if writer is not None:
                writer.join(timeout=1.0)
        result = RunResult(command, code, out.value(), err.value(), time.monotonic() - start, err.dropped)
        log.debug("%s: ran %s: exit %s in %.2f s", self.host.name, short(command, 80), code, result.seconds)
        return self.check_failed(result) if check else result

    @contextmanager
    def stream_out(self, command: str, *, timeout: float | None = None) -> Iterator[IO[bytes]]:
        timeout = timeout or self.host.command_timeout
        proc = self._spawn(command, stdin=False)
        stderr = Capture(STDERR_MAX, tail=True)

        def drain_stderr() -> None:
            while chunk := proc.stderr.read1(CHUNK):  # type: ignore[union-attr]
                stderr.add(chunk)

        drain = threading.Thread(target=drain_stderr, daemon=True)
        drain.start()
        reader = _DeadlineReader(proc, time.monotonic() + timeout, max(self.host.connect_timeout, 30.0),
                                 self.host.name, command)
        try:
            yield reader  # type: ignore[misc]
            code = proc.wait(timeout=max(0.1, reader.deadline - time.monotonic()))
            drain.join(timeout=1.0)
            if code != 0:
                raise RemoteError(self.host.name, short(command), f"exit {code}: {stderr.value().decode(errors='replace')[-2000:]}",
                                  kind="exit")
        except subprocess.TimeoutExpired as exc:
            raise TransportError(self.host.name, f"stream timed out: {short(command)}") from exc
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            proc.stdout.close()  # type: ignore[union-attr]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the command and everything it started in its session (what closing an SSH session does)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class _DeadlineReader(StreamReader):
    """A command's stdout: each read waits at most ``read_timeout`` for data, the whole stream ends at ``deadline``."""

    def __init__(self, proc: subprocess.Popen[bytes], deadline: float, read_timeout: float, host: str, command: str) -> None:
        self.proc, self.deadline, self.read_timeout, self.host, self.command = proc, deadline, read_timeout, host, command
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)

    def read_chunk(self, size: int) -> bytes:
        now = time.monotonic()
        if now > self.deadline:
            raise TransportError(self.host, f"stream timed out: {short(self.command)}")
        if not self.sel.select(timeout=min(self.read_timeout, self.deadline - now)):
            raise TransportError(self.host, f"no data from {short(self.command)} within the read timeout")
        return os.read(self.fd, size)


class _LocalSessionChannel(SessionChannel):
    """A long-lived local command's pipes as a session channel. Closing it closes the command's input, which is how
    the command learns that this side is done (or gone); the command itself is left to finish on its own, as a
    remote one is when its SSH channel closes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.closed = False
        self._fds = {"out": proc.stdout.fileno(), "err": proc.stderr.fileno()}  # type: ignore[union-attr]
        for fd in self._fds.values():
            os.set_blocking(fd, False)

    def _ready(self, fd: int) -> bool:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            return bool(sel.select(timeout=0))

    def _read(self, fd: int, size: int) -> bytes:
        try:
            return os.read(fd, size)
        except BlockingIOError:
            return b""

    def recv_ready(self) -> bool:
        return not self.closed and self._ready(self._fds["out"])

    def recv(self, size: int) -> bytes:
        return self._read(self._fds["out"], size)

    def recv_stderr_ready(self) -> bool:
        return not self.closed and self._ready(self._fds["err"])

    def recv_stderr(self, size: int) -> bytes:
        return self._read(self._fds["err"], size)

    def exit_status_ready(self) -> bool:
        return self.proc.poll() is not None

    def sendall(self, data: bytes) -> None:
        if self.closed or self.proc.stdin is None:
            raise EOFError("session closed")
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
