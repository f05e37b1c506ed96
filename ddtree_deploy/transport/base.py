"""How commands reach a host: one connection per host, never without a timeout, one reply protocol.

This module is the transport contract; the implementations live next to it (``ssh``: Fabric/paramiko, strict host
keys, ssh_config and ProxyJump honoured, keys from the agent like OpenSSH; ``local``: ``connection: local``, local
subprocesses, so the tool runs on the GPU box itself) and are found through the registry in the package's
``__init__`` (``TRANSPORTS``: the host file's ``connection`` value -> ``"module:Class"``, imported only when a host
of that kind is connected, so a machine without paramiko can still run every command against its local host).
``HostConnection(host)`` (or ``transport.connect(host)``) gives the class the host file asks for. Nothing here
imports an implementation.

Every connection offers the same four primitives the rest of the tool is built on: ``run`` (a shell command,
optionally fed bytes on its stdin, never ours), ``send_stream`` / ``stream_out`` (binary tar streams in either
direction) and ``call`` (one round trip to an op of the stdlib-only package ``ddtree_deploy.remote``, shipped as a
zip by ``bundle``). A transport whose ``holds_session`` is true also offers ``session`` (below).
tests/test_transport_contract.py checks all of it against every registered transport.

What a host sends back is bounded on this side whatever the host does: a command's stdout is kept up to
``STDOUT_MAX`` bytes (past that the command is stopped and the run is an error of kind ``output``), its stderr to
its last ``STDERR_MAX`` bytes (with a note of what was dropped), and a reply is parsed against its schema
(``replies``), so a flooding or lying host costs bounded memory and ends in a clear error naming it.

The session channel (``HostConnection.session``; what the host lock's guardian is held on, ``lease.Lease``)
-------------------------------------------------------------------------------------------------------------
A long-lived helper process on a channel of its own, carrying three things:

* in (control side -> host), on the process's stdin: first the framed request (``bundle.framed_request``: the
  module's zip, then module, op and arguments, the same ``bundle.BOOT`` framing as ``call``), then command lines, one
  per ``\n`` (the lock sends ``hb`` heartbeats and its closing commands);
* out (host -> control side), on its stdout: reply lines, each ``RESULT_MARKER`` + one JSON envelope + ``\n``
  (``RemoteSession.reply``; anything before a marker is ignored), and on its stderr what the program says when it
  fails (quoted in the error when the session ends without an answer);
* the end: EOF on the process's stdin means the control side went away (it closed the channel, or the process or
  the connection carrying the channel died), and the host-side program must act on it by itself (the guardian
  settles the run and releases the lock); the channel reporting ``closed`` / ``exit_status_ready`` tells the
  control side the host side ended.

A transport implements the channel as a :class:`SessionChannel` returned by ``_session_channel`` and says so with
``holds_session = True``; one that cannot keep such a channel open (no stdin that stays open, no EOF when the
control side dies) sets it False, and the host lock refuses such a host with an error naming the host and the
transport kind, instead of running unguarded.
"""

from __future__ import annotations

import importlib
import logging
import shlex
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Iterator

from ..errors import RemoteError, TransportError
from .registry import TRANSPORTS
from ..remote import RESULT_MARKER
from .bundle import BOOT, framed_request

if TYPE_CHECKING:  # the inventory reads the registry (connection kinds), so it is not imported here at run time
    from ..inventory import Host

log = logging.getLogger("ddtree_deploy.transport")
#: Bytes read from a command's output at a time.
CHUNK = 1 << 16
#: Seconds between polls of a session channel.
_POLL = 0.002
#: Most bytes of a command's stdout kept (twice ``replies.REPLY_MAX``: a helper's reply is at most about 1 MiB).
STDOUT_MAX = 16 << 20
#: Most bytes of a command's stderr kept: its tail (what error messages quote).
STDERR_MAX = 256 << 10

@dataclass
class RunResult:
    """What a command did. ``exit_code`` is -1 when the channel closed without a status."""

    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float
    stderr_dropped: int = 0  # bytes of stderr before the kept tail

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class Capture:
    """One output stream of a command, kept to ``limit`` bytes: the head (stdout: ``add`` says False once it is
    full, and the caller stops the command) or the tail (stderr: older bytes are dropped and counted)."""

    def __init__(self, limit: int, *, tail: bool = False) -> None:
        self.buf = bytearray()
        self.limit, self.tail = limit, tail
        self.dropped = 0

    def add(self, data: bytes) -> bool:
        """Keep ``data`` (within the limit); False when a head capture overflowed."""
        self.buf += data
        over = len(self.buf) - self.limit
        if over <= 0:
            return True
        self.dropped += over
        if self.tail:
            del self.buf[:over]
            return True
        del self.buf[self.limit:]
        return False

    def value(self) -> bytes:
        return bytes(self.buf)


def output_overflow(host: str, what: str) -> RemoteError:
    """The error for a command whose stdout passed STDOUT_MAX: it was stopped there."""
    return RemoteError(host, what, f"printed more than {STDOUT_MAX >> 20} MiB on stdout, so it was stopped there (the "
                       "control side keeps no more; a helper's reply is far smaller): something on the host writes "
                       "to stdout, e.g. the host file's 'python' or a shell start-up file", kind="output")


class HostConnection:
    """A session to one host. Use as a context manager; every operation has a deadline.

    ``HostConnection(host)`` returns the class the registry (``ddtree_deploy.transport.registry.TRANSPORTS``) names for
    ``host.connection`` (``SSHConnection``, ``LocalConnection``, ...); subclasses implement ``open``, ``close``,
    ``run`` and ``stream_out``, and ``_session_channel`` where ``holds_session`` is true.
    """

    host: Host
    #: Whether this transport can hold a session channel (module docstring); the host lock needs one.
    holds_session: bool = False

    def __new__(cls, host: Host, *args: Any, **kwargs: Any) -> "HostConnection":
        if cls is HostConnection:
            cls = transport_class(getattr(host, "connection", "ssh"))
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
            tail = _tail(result.stderr) or _tail(result.stdout)
            if result.stderr_dropped:
                tail = f"[{result.stderr_dropped} earlier bytes of stderr dropped] {tail}"
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

        try:
            result = self.run(command, stdin=head if stream is None else counted(), timeout=timeout, check=False)
        except RemoteError as exc:
            if exc.kind != "output":
                raise
            raise output_overflow(self.host.name, f"{module}.{op}") from None
        log.debug("%s: %s.%s exit %s in %.2f s", self.host.name, module, op, result.exit_code, result.seconds)
        if stream is not None and result.exit_code == -1 and RESULT_MARKER.encode() not in result.stdout:
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
        """The next complete reply line; what comes before its marker is dropped, so the buffer stays bounded."""
        from ..replies import REPLY_MAX, malformed

        marker = RESULT_MARKER.encode()
        at = self._buf.find(marker)
        if at < 0:
            self._buf = self._buf[-(len(marker) - 1):]  # a marker split across reads is kept
            return None
        self._buf = self._buf[at:]
        end = self._buf.find(b"\n", len(marker))
        if end < 0:
            if len(self._buf) > REPLY_MAX + len(marker):
                raise malformed(self.host, self.op, f"a reply line of more than {REPLY_MAX >> 20} MiB")
            return None
        line, self._buf = self._buf[len(marker):end], self._buf[end + 1:]
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
                err = Capture(STDERR_MAX, tail=True)
                try:
                    while self.chan.recv_stderr_ready() and err.dropped < STDERR_MAX:
                        chunk = self.chan.recv_stderr(CHUNK)
                        if not chunk:  # the end of stderr (a local pipe stays "ready" at EOF)
                            break
                        err.add(chunk)
                except Exception:
                    pass
                tail = _tail(err.value(), 1500)
                raise TransportError(self.host, f"remote {self.op} ended without an answer: {tail or exc}") from exc
            time.sleep(_POLL)
        from ..replies import parse

        return parse(self.host, self.op, line)

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
    """The helper's reply (the line after the last RESULT_MARKER on stdout), parsed against its schema
    (``replies.parse``), or RemoteError with what the program said instead."""
    from ..replies import parse

    marker = RESULT_MARKER.encode()
    at = result.stdout.rfind(marker)
    if at < 0:
        detail = _tail(result.stderr) or _tail(result.stdout)
        raise RemoteError(host, what, f"helper exited {result.exit_code} without a result: {detail}", kind="crash")
    line = result.stdout[at + len(marker):].lstrip()
    return parse(host, what, line.split(b"\n", 1)[0])


def _tail(data: bytes, limit: int = 2000) -> str:
    """The last ``limit`` characters of a command's output, as text for a message."""
    return data[-4 * limit:].decode(errors="replace").strip()[-limit:]


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


def short(command: str, limit: int = 120) -> str:
    """A command shortened for messages."""
    command = " ".join(command.split())
    return command if len(command) <= limit else command[: limit - 3] + "..."


def transport_class(kind: str) -> type[HostConnection]:
    """The class for ``connection: <kind>`` (the registry's ``"module:Class"``), imported on first use."""
    try:
        target = TRANSPORTS[kind]
    except KeyError:
        raise ValueError(f"unknown connection {kind!r} (known: {', '.join(TRANSPORTS)})") from None
    module, _, name = target.partition(":")
    mod = importlib.import_module(module if "." in module else f"{__package__}.{module}")
    cls = getattr(mod, name)
    if not (isinstance(cls, type) and issubclass(cls, HostConnection)):
        raise TypeError(f"transport {kind!r}: {target} is not a HostConnection")
    return cls
