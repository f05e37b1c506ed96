"""SSH transport: one Fabric connection per host, strict about host keys and never without a timeout.

Fabric's defaults are wrong for a deployment tool: it auto-accepts unknown host keys, has no connect or command
timeout, and forwards our stdin to the remote process. ``HostConnection`` fixes each of those before the first
byte is sent (see shared/docs/deploy-anchors.md §3), and offers three primitives the rest of the tool is built on:
``run`` (a command, optionally fed bytes on its stdin), ``stream_out`` / ``send_stream`` (binary tar streams in
either direction) and ``call`` (one round trip to the stdlib-only helper in ``ddtree_deploy.remote``).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Iterable, Iterator

import paramiko
from fabric import Config, Connection

from .errors import HostKeyError, RemoteError, TransportError
from .inventory import Host
from .remote import RESULT_MARKER, SESSION_BOOT, program_for

_POLL = 0.002
_CHUNK = 1 << 16


@dataclass
class RunResult:
    """What a remote command did. ``exit_code`` is -1 when the channel closed without a status."""

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


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Record an unknown key in the host's known_hosts file once. Changed keys still fail (paramiko raises first)."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self.known_hosts) or ".", exist_ok=True)
        with open(self.known_hosts, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _harden(conn: Connection, host: Host) -> None:
    """Replace Fabric's AutoAddPolicy with strict checking on the connection and on every gateway hop."""
    known = os.path.expanduser(host.known_hosts)
    client = conn.client
    client.set_missing_host_key_policy(
        _TrustOnFirstUse(known) if host.trust_on_first_use else paramiko.RejectPolicy()
    )
    if os.path.exists(known):
        client.load_host_keys(known)
    if isinstance(conn.gateway, Connection):
        _harden(conn.gateway, host)


class HostConnection:
    """An SSH session to one host. Use as a context manager; every operation has a deadline."""

    def __init__(self, host: Host) -> None:
        self.host = host
        overrides: dict[str, Any] = {"load_ssh_configs": True}
        config = Config(overrides=overrides, runtime_ssh_path=os.path.expanduser(host.ssh_config)) if host.ssh_config else Config(overrides=overrides)
        timeout = host.connect_timeout
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": timeout,
            "auth_timeout": timeout,
            "channel_timeout": timeout,
            "allow_agent": False,
        }
        if host.identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
            connect_kwargs["look_for_keys"] = False
        self.conn = Connection(
            host.target,
            user=host.user,
            port=host.port,
            config=config,
            connect_timeout=timeout,
            connect_kwargs=connect_kwargs,
        )
        _harden(self.conn, host)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> "HostConnection":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Connect, mapping every way this can fail to a message that names the host and what to do."""
        if self.conn.is_connected:
            return
        name = self.host.name
        where = f"{self.conn.host}:{self.conn.port}"
        t = self.host.connect_timeout
        try:
            self.conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                name,
                f"host key for {where} has CHANGED (got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}); refusing to connect",
                hint=f"if the host was really re-installed, remove its old entry from {self.host.known_hosts}",
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise TransportError(name, f"authentication to {where} as {self.conn.user} failed: {exc}",
                                 hint="check identity_file and user in the host file") from exc
        except paramiko.SSHException as exc:
            text = str(exc)
            if "not found in known_hosts" in text:
                raise HostKeyError(
                    name,
                    f"unknown host key for {where}: not in {self.host.known_hosts}; refusing to connect",
                    hint=f"verify the key, then `ssh-keyscan -p {self.conn.port} {self.conn.host} >> {self.host.known_hosts}`, "
                    "or set trust_on_first_use: true in the host file",
                ) from exc
            if "banner" in text.lower() or "no existing session" in text.lower():
                # paramiko reports a silent peer either as a banner error or, when the handshake wait ends first,
                # as a missing session; both mean the same to the user
                raise TransportError(name, f"{where} accepted TCP but completed no SSH handshake (no banner) within {t:g} s") from exc
            raise TransportError(name, f"SSH negotiation with {where} failed: {text}") from exc
        except socket.gaierror as exc:
            raise TransportError(name, f"cannot resolve {self.conn.host}: {exc.strerror}") from exc
        except (socket.timeout, TimeoutError) as exc:
            raise TransportError(name, f"connecting to {where} timed out after {t:g} s") from exc
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, OSError) as exc:
            raise TransportError(name, f"cannot connect to {where}: {exc}") from exc
        transport = self.conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)

    def close(self) -> None:
        self.conn.close()

    def _channel(self) -> paramiko.Channel:
        self.open()
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError(self.host.name, "SSH connection dropped")
        try:
            return transport.open_session(timeout=self.host.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(self.host.name, f"cannot open an SSH channel: {exc}") from exc

    # -- commands ------------------------------------------------------------------------------------------------
    def run(
        self,
        command: str,
        *,
        stdin: bytes | Iterable[bytes] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> RunResult:
        """Run ``command`` through the host's shell; feed ``stdin`` (never ours) and enforce ``timeout``."""
        timeout = timeout or self.host.command_timeout
        start = time.monotonic()
        deadline = start + timeout
        chan = self._channel()
        out, err = bytearray(), bytearray()
        writer_error: list[BaseException] = []
        try:
            chan.exec_command(command)
            writer = self._start_writer(chan, stdin, writer_error)
            while True:
                progressed = False
                while chan.recv_ready():
                    out += chan.recv(_CHUNK)
                    progressed = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK)
                    progressed = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not chan.recv_ready():
                    break
                if time.monotonic() > deadline:
                    raise TransportError(self.host.name, f"command timed out after {timeout:g} s: {_short(command)}")
                if not progressed:
                    time.sleep(_POLL)
            if writer is not None:
                writer.join(timeout=max(0.1, deadline - time.monotonic()))
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(self.host.name, f"SSH channel failed during {_short(command)}: {exc}") from exc
        finally:
            chan.close()
        result = RunResult(command, code, bytes(out), bytes(err), time.monotonic() - start)
        if check and code != 0:
            tail = result.stderr.decode(errors="replace").strip()[-2000:] or result.text().strip()[-2000:]
            raise RemoteError(self.host.name, _short(command), f"exit {code}: {tail}", kind="exit")
        return result

    @staticmethod
    def _start_writer(chan: paramiko.Channel, stdin: bytes | Iterable[bytes] | None, errors: list[BaseException]) -> threading.Thread | None:
        if stdin is None:
            chan.shutdown_write()
            return None
        chunks: Iterable[bytes] = [stdin] if isinstance(stdin, (bytes, bytearray)) else stdin

        def pump() -> None:
            try:
                for chunk in chunks:
                    if chunk:
                        chan.sendall(chunk)
            except BaseException as exc:  # surfaced by the caller through the exit status
                errors.append(exc)
            finally:
                try:
                    chan.shutdown_write()
                except Exception:
                    pass

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        return thread

    def send_stream(self, command: str, chunks: Iterable[bytes], *, timeout: float | None = None) -> RunResult:
        """Pipe ``chunks`` (e.g. a tar archive being written) into ``command``'s stdin on the host."""
        return self.run(command, stdin=chunks, timeout=timeout)

    @contextmanager
    def stream_out(self, command: str, *, timeout: float | None = None) -> Iterator[IO[bytes]]:
        """Yield a file object reading ``command``'s stdout as it is produced (e.g. ``tar -c``).

        Each read waits at most the connect timeout for data, and the whole stream at most ``timeout``; a non-zero
        exit is raised when the block ends.
        """
        timeout = timeout or self.host.command_timeout
        chan = self._channel()
        chan.settimeout(max(self.host.connect_timeout, 30.0))
        deadline = time.monotonic() + timeout
        chan.exec_command(command)
        chan.shutdown_write()
        reader = _DeadlineReader(chan, deadline, self.host.name, command)
        try:
            yield reader
            code = chan.recv_exit_status()
            if code != 0:
                err = b""
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK)
                raise RemoteError(self.host.name, _short(command), f"exit {code}: {err.decode(errors='replace')[-2000:]}", kind="exit")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(self.host.name, f"stream from {_short(command)} failed: {exc}") from exc
        finally:
            chan.close()

    # -- the remote helper ---------------------------------------------------------------------------------------
    def call(self, module: str, op: str, *, timeout: float | None = None, python: str | None = None, **args: Any) -> Any:
        """One round trip: run ``op`` of ``ddtree_deploy/remote/<module>.py`` under the host's Python, get JSON back."""
        payload = json.dumps({"op": op, "args": args}).encode()
        program = program_for(module)
        boot = (
            "import sys,json,zlib,base64;d=sys.stdin.buffer.read();n=int.from_bytes(d[:8],'big');"
            "exec(compile(zlib.decompress(d[8:8+n]),'<ddtree-remote>','exec'),{'__name__':'__ddtree_remote__','_PAYLOAD':d[8+n:]})"
        )
        blob = zlib.compress(program, 6)
        data = len(blob).to_bytes(8, "big") + blob + payload
        interpreter = python or self.host.python
        result = self.run(f"{shlex.quote(interpreter)} -c {shlex.quote(boot)}", stdin=data, timeout=timeout, check=False)
        text = result.text()
        if RESULT_MARKER not in text:
            detail = (result.stderr.decode(errors="replace") or text).strip()[-2000:]
            raise RemoteError(self.host.name, f"{module}.{op}", f"helper exited {result.exit_code} without a result: {detail}", kind="crash")
        reply = json.loads(text.rsplit(RESULT_MARKER, 1)[1].strip().splitlines()[0])
        if not reply.get("ok"):
            raise RemoteError(self.host.name, f"{module}.{op}", reply.get("error", "unknown error"), kind=reply.get("kind", "error"))
        return reply.get("result")

    def session(self, module: str, op: str, **args: Any) -> "RemoteSession":
        """Start ``op`` of ``ddtree_deploy/remote/<module>.py`` as a long-lived process on a channel of its own.

        It answers with reply lines (``RemoteSession.reply``) and reads command lines (``RemoteSession.send``); the
        end of its input is the channel closing, whether we close it or the connection dies (the host's deploy lock
        is held this way: see ``release.Lease``).
        """
        program = zlib.compress(program_for(module), 6)
        payload = json.dumps({"op": op, "args": args}).encode()
        chan = self._channel()
        try:
            chan.exec_command(f"exec {shlex.quote(self.host.python)} -c {shlex.quote(SESSION_BOOT)}")
            chan.sendall(len(program).to_bytes(8, "big") + program + len(payload).to_bytes(8, "big") + payload)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise TransportError(self.host.name, f"cannot start remote {module}.{op}: {exc}") from exc
        return RemoteSession(chan, self.host.name, f"{module}.{op}")


class RemoteSession:
    """The control side of a session op: reply lines out of it, command lines into it."""

    def __init__(self, chan: paramiko.Channel, host: str, op: str) -> None:
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
                    chunk = self.chan.recv(_CHUNK)
                    if not chunk:
                        raise EOFError("connection closed")
                    self._buf += chunk
                    continue
                if self.chan.closed or self.chan.exit_status_ready():
                    raise EOFError("connection closed")
            except (paramiko.SSHException, OSError, EOFError) as exc:
                err = b""
                try:
                    while self.chan.recv_stderr_ready():
                        err += self.chan.recv_stderr(_CHUNK)
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
        except (paramiko.SSHException, OSError, EOFError):
            return False

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:
            pass


class _DeadlineReader:
    """A read-only file object over a channel's stdout that enforces an overall deadline."""

    def __init__(self, chan: paramiko.Channel, deadline: float, host: str, command: str) -> None:
        self.chan, self.deadline, self.host, self.command = chan, deadline, host, command

    def read(self, size: int = -1) -> bytes:
        if time.monotonic() > self.deadline:
            raise TransportError(self.host, f"stream timed out: {_short(self.command)}")
        if size is None or size < 0:
            parts = []
            while True:
                chunk = self.read(_CHUNK)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        buf = bytearray()
        while len(buf) < size:
            try:
                chunk = self.chan.recv(size - len(buf))
            except socket.timeout as exc:
                raise TransportError(self.host, f"no data from {_short(self.command)} within the read timeout") from exc
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def readable(self) -> bool:
        return True


def _short(command: str, limit: int = 120) -> str:
    command = " ".join(command.split())
    return command if len(command) <= limit else command[: limit - 3] + "..."
