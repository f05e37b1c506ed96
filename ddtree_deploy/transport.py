"""How commands reach a host: one connection per host, never without a timeout, one reply protocol.

``HostConnection(host)`` gives the connection the host file asks for: SSH (``ssh_transport``, Fabric/paramiko,
strict host keys, ssh_config and ProxyJump honoured, keys from the agent like OpenSSH) or, for
``connection: local``, a local subprocess (``local_transport``) so the tool runs on the GPU box itself. The SSH
libraries are imported only when an SSH host is actually connected: a machine without paramiko can still run
every command against its local host.

Every connection offers the same four primitives the rest of the tool is built on: ``run`` (a shell command,
optionally fed bytes on its stdin, never ours), ``send_stream`` / ``stream_out`` (binary tar streams in either
direction) and ``call`` (one round trip to the stdlib-only helper programs in ``ddtree_deploy.remote``).
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator

from .errors import RemoteError, TransportError
from .inventory import Host
from .remote import BOOT, RESULT_MARKER, framed_request

log = logging.getLogger("ddtree_deploy.transport")
#: Bytes read from a command's output at a time.
CHUNK = 1 << 16
#: Seconds between polls of a session channel.
_POLL = 0.002

@dataclass
class RunResult:
    """What a command did. ``exit_code`` is -1 when the channel closed without a status."""

    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class HostConnection:
    """A session to one host. Use as a context manager; every operation has a deadline.

    ``HostConnection(host)`` returns the subclass for ``host.connection`` (``SSHConnection`` or
    ``LocalConnection``); subclasses implement ``open``, ``close``, ``run`` and ``stream_out``.
    """

    host: Host

    def __new__(cls, host: Host, *args: Any, **kwargs: Any) -> "HostConnection":
        if cls is HostConnection:
            cls = _connection_class(host)
        return super().__new__(cls)

    def __init__(self, host: Host) -> None:
        self.host = host

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> "HostConnection":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- commands ----------------------------------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes | Iterable[bytes] | None = None, timeout: float | None = None,
            check: bool = True) -> RunResult:
        """Run ``command`` through the host's shell; feed ``stdin`` (never ours) and enforce ``timeout``."""
        raise NotImplementedError

    def stream_out(self, command: str, *, timeout: float | None = None) -> AbstractContextManager[IO[bytes]]:
        """A file object reading ``command``'s stdout as it is produced (e.g. ``tar -c``); each read waits a bounded
        time for data and the whole stream at most ``timeout``; a non-zero exit is raised when the block ends."""
        raise NotImplementedError

    def send_stream(self, command: str, chunks: Iterable[bytes], *, timeout: float | None = None) -> RunResult:
        """Pipe ``chunks`` (e.g. a tar archive being written) into ``command``'s stdin on the host."""
        return self.run(command, stdin=chunks, timeout=timeout)

    def check_failed(self, result: RunResult) -> RunResult:
        """Raise RemoteError for a non-zero exit, with the tail of what the command said."""
        if result.exit_code != 0:
            tail = result.stderr.decode(errors="replace").strip()[-2000:] or result.text().strip()[-2000:]
            raise RemoteError(self.host.name, short(result.command), f"exit {result.exit_code}: {tail}", kind="exit")
        return result

    # -- the remote helper -------------------------------------------------------------------------------------------
    def call(self, module: str, op: str, *, timeout: float | None = None, python: str | None = None,
             stream: Iterable[bytes] | None = None, label: str | None = None, **args: Any) -> Any:
        """One round trip: run ``op`` of ``ddtree_deploy/remote/<module>.py`` under the host's Python, get JSON back.

        The streamed form: ``stream`` (e.g. an overlay's tar) follows the request on the program's stdin, for an op
        that reads it itself (release ``receive``), so a payload and the op that consumes it are one round trip.
        ``label`` goes on the host's command line, so the host can find the process by what it works on (the
        guardian stops what is left of a cut push by its staging path). A stream cut before the op answered is a
        TransportError saying how much was sent.
        """
        head = framed_request(module, op, args)
        command = f"{shlex.quote(python or self.host.python)} -c {shlex.quote(BOOT)}"
        if label is not None:
            command += " " + shlex.quote(label)
        sent = 0

        def counted() -> Iterator[bytes]:
            nonlocal sent
            yield head
            for chunk in stream or ():
                sent += len(chunk)
                yield chunk

        result = self.run(command, stdin=head if stream is None else counted(), timeout=timeout, check=False)
        log.debug("%s: %s.%s exit %s in %.2f s", self.host.name, module, op, result.exit_code, result.seconds)
        if stream is not None and result.exit_code == -1 and RESULT_MARKER not in result.text():
            raise TransportError(self.host.name, f"connection lost while streaming into remote {module}.{op} "
                                 f"({sent} bytes sent)")
        return parse_reply(self.host.name, f"{module}.{op}", result)

    def session(self, module: str, op: str, **args: Any) -> "RemoteSession":
        """Start ``op`` of ``ddtree_deploy/remote/<module>.py`` as a long-lived process on a channel of its own.

        It answers with reply lines (``RemoteSession.reply``) and reads command lines (``RemoteSession.send``); the
        end of its input is the channel closing, whether we close it or the connection dies (the host's deploy lock
        is held this way: see ``release.Lease``).
        """
        chan = self._session_channel(f"exec {shlex.quote(self.host.python)} -c {shlex.quote(BOOT)}")
        try:
            chan.sendall(framed_request(module, op, args))
        except (OSError, EOFError) as exc:
            chan.close()
            raise TransportError(self.host.name, f"cannot start remote {module}.{op}: {exc}") from exc
        return RemoteSession(chan, self.host.name, f"{module}.{op}")

    def _session_channel(self, command: str) -> "SessionChannel":
        """``command`` started on a channel of its own (its input open) for :meth:`session`."""
        raise NotImplementedError


class SessionChannel:
    """What a session needs of its channel, whatever carries it (an SSH channel, a local pipe pair): non-blocking
    reads of stdout and stderr, whether the command ended, a write to its stdin, close. Errors are OSError/EOFError."""

    closed: bool

    def recv_ready(self) -> bool:
        raise NotImplementedError

    def recv(self, size: int) -> bytes:
        raise NotImplementedError

    def recv_stderr_ready(self) -> bool:
        raise NotImplementedError

    def recv_stderr(self, size: int) -> bytes:
        raise NotImplementedError

    def exit_status_ready(self) -> bool:
        raise NotImplementedError

    def sendall(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class RemoteSession:
    """The control side of a session op: reply lines out of it, command lines into it."""

    def __init__(self, chan: SessionChannel, host: str, op: str) -> None:
        self.chan, self.host, self.op = chan, host, op
        self._buf = b""

    def _line(self) -> bytes | None:
        marker = RESULT_MARKER.encode()
        if marker not in self._buf:
            return None
        rest = self._buf.split(marker, 1)[1]
        if b"\n" not in rest:
            return None
        line, self._buf = rest.split(b"\n", 1)
        return line

    def reply(self, timeout: float) -> Any:
        """The next reply; RemoteError for a failure it reports, TransportError when it ends without one."""
        deadline = time.monotonic() + timeout
        while (line := self._line()) is None:
            if time.monotonic() > deadline:
                raise TransportError(self.host, f"remote {self.op} gave no answer within {timeout:g} s")
            try:
                if self.chan.recv_ready():
                    chunk = self.chan.recv(CHUNK)
                    if not chunk:
                        raise EOFError("connection closed")
                    self._buf += chunk
                    continue
                if self.chan.closed or self.chan.exit_status_ready():
                    raise EOFError("connection closed")
            except (OSError, EOFError) as exc:
                err = b""
                try:
                    while self.chan.recv_stderr_ready():
                        err += self.chan.recv_stderr(CHUNK)
                except Exception:
                    pass
                tail = err.decode(errors="replace").strip()[-1500:]
                raise TransportError(self.host, f"remote {self.op} ended without an answer: {tail or exc}") from exc
            time.sleep(_POLL)
        reply = json.loads(line)
        if not reply.get("ok", True):
            raise RemoteError(self.host, self.op, reply.get("error", "unknown error"), kind=reply.get("kind", "error"))
        return reply.get("result")

    def send(self, line: str) -> bool:
        """Send one command line; False when the channel is gone."""
        try:
            self.chan.sendall(line.encode() + b"\n")
            return True
        except (OSError, EOFError):
            return False

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:
            pass


def parse_reply(host: str, what: str, result: RunResult) -> Any:
    """The helper's reply (after RESULT_MARKER on stdout), or RemoteError with what the program said instead."""
    text = result.text()
    if RESULT_MARKER not in text:
        detail = (result.stderr.decode(errors="replace") or text).strip()[-2000:]
        raise RemoteError(host, what, f"helper exited {result.exit_code} without a result: {detail}", kind="crash")
    reply = json.loads(text.rsplit(RESULT_MARKER, 1)[1].strip().splitlines()[0])
    if not reply.get("ok"):
        raise RemoteError(host, what, reply.get("error", "unknown error"), kind=reply.get("kind", "error"))
    return reply.get("result")


def pump_stdin(stdin: bytes | Iterable[bytes], send: Callable[[bytes], Any], close: Callable[[], Any]) -> threading.Thread:
    """Feed ``stdin`` to a running command from a thread (a large tar stream must not wait for the output loop),
    then close the command's input. A write that fails is left for the command's exit status to explain."""
    chunks: Iterable[bytes] = [stdin] if isinstance(stdin, (bytes, bytearray)) else stdin

    def pump() -> None:
        try:
            for chunk in chunks:
                if chunk:
                    send(chunk)
        except Exception:
            pass
        finally:
            try:
                close()
            except Exception:
                pass

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


class StreamReader:
    """A read-only file object over a command's stdout (what ``stream_out`` yields; tarfile reads it).

    Subclasses implement ``read_chunk(n)``: at most ``n`` bytes, b"" at the end, raising TransportError when the
    stream's deadline passes or no data comes within the read timeout.
    """

    def read_chunk(self, size: int) -> bytes:
        raise NotImplementedError

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            parts = []
            while chunk := self.read_chunk(CHUNK):
                parts.append(chunk)
            return b"".join(parts)
        buf = bytearray()
        while len(buf) < size:
            chunk = self.read_chunk(size - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def readable(self) -> bool:
        return True


def _connection_class(host: Host) -> type[HostConnection]:
    """The implementation for the host file's ``connection``; imported here so SSH libraries load only for SSH."""
    if getattr(host, "connection", "ssh") == "local":
        from .local_transport import LocalConnection

        return LocalConnection
    from .ssh_transport import SSHConnection

    return SSHConnection


def short(command: str, limit: int = 120) -> str:
    """A command shortened for messages."""
    command = " ".join(command.split())
    return command if len(command) <= limit else command[: limit - 3] + "..."

