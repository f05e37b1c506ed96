"""The SSH connection: one Fabric connection per host, strict about host keys, never without a timeout.

Fabric's defaults are wrong for a deployment tool: it auto-accepts unknown host keys, has no connect or command
timeout, and forwards our stdin to the remote process. ``SSHConnection`` fixes each of those before the first byte
is sent, on the target and on every ProxyJump hop (the hops get the same timeouts and key policy through the
shared Fabric config). Authentication works like OpenSSH: the host file's ``identity_file`` (else the default keys
and ssh_config's IdentityFile), and keys held in ssh-agent unless the host file says ``ssh_agent: false`` or
ssh_config says ``IdentityAgent none`` / ``IdentitiesOnly yes``.

Every way a connection can fail becomes one message that names the host and what to do: an ``ssh_alias`` that
ssh_config does not define names the file and its entries, an unreachable ProxyJump bastion is named as the
bastion (not the target), and a port that does not speak SSH says so in one line.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shlex
import socket
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import paramiko
from fabric import Config, Connection

from ..errors import ConnectFailed, HostKeyError, InputError, RemoteError, TransportError
from ..inventory import Host
from ..ssh_config import config_files, paramiko_config, resolve
from .base import (CHUNK, STDERR_MAX, STDOUT_MAX, Capture, HostConnection, RunResult, SessionChannel,
                        StreamReader, output_overflow, pump_stdin, short)

log = logging.getLogger("ddtree_deploy.transport")
# paramiko's transport thread logs its own exceptions (tracebacks included) at ERROR; we report every failure
# ourselves, so its log is shown only with -vv (console.setup_logging), never by logging's last-resort handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

#: how long output may still arrive after the exit status when no EOF comes (a daemon kept the stdout)
_EXIT_GRACE = 0.5
_POLL = 0.002
#: Seconds given to stopping what is left of a timed-out command (``SSHConnection._stop_leftover``).
_STOP_WAIT = 5.0
#: Run on the host by ``_stop_leftover``: argv is the sshd process of this connection and the timed-out command;
#: the sessions sshd started for exactly that command (its shell's last argument) are killed, process group and all.
_STOP = r"""
import os, signal, sys
parent, command, me = int(sys.argv[1]), os.fsencode(sys.argv[2]), os.getpgid(0)
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open("/proc/%s/stat" % pid, "rb") as fh:
            ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        with open("/proc/%s/cmdline" % pid, "rb") as fh:
            args = fh.read().split(b"\0")
        if ppid == parent and len(args) >= 2 and args[-2] == command and os.getpgid(int(pid)) == int(pid) != me:
            os.killpg(int(pid), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
"""


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


def _hops(conn: Connection) -> list[Connection]:
    """The ProxyJump connections in front of ``conn``, in the order they must be opened (first hop first)."""
    chain = []
    gateway = conn.gateway
    while isinstance(gateway, Connection):
        chain.append(gateway)
        gateway = gateway.gateway
    return chain[::-1]


def _agent_wanted(host: Host, ssh_config: dict[str, Any]) -> bool:
    """Use ssh-agent as OpenSSH does: on, unless the host file or the host's ssh_config entry turns it off."""
    if not host.ssh_agent:
        return False
    if str(ssh_config.get("identityagent", "")).lower() == "none":
        return False
    return not (str(ssh_config.get("identitiesonly", "no")).lower() == "yes" and ssh_config.get("identityfile"))


class SSHConnection(HostConnection):
    """An SSH session to one host (see the module docstring for what it does differently from plain Fabric)."""

    #: a channel of the connection, its stdin open; it closes (EOF on the host) when we close it or sshd loses us
    holds_session = True

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self._config_paths = config_files(host)
        if host.ssh_config and not os.path.isfile(os.path.expanduser(host.ssh_config)):
            raise InputError(f"{host.source}: field 'ssh_config': {host.ssh_config} does not exist")
        timeout = host.connect_timeout
        # Everything goes through the config, not Connection(connect_kwargs=...): Fabric builds each ProxyJump hop
        # from a clone of the config alone, and the hops need the same timeouts and authentication as the target.
        connect_kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout, "channel_timeout": timeout}
        if host.identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
            connect_kwargs["look_for_keys"] = False
        overrides: dict[str, Any] = {"connect_kwargs": connect_kwargs, "timeouts": {"connect": timeout}}
        # paramiko reads the files for what a connection needs beyond the address (IdentityFile, ProxyJump hops),
        # their Includes expanded first (ssh_config.py); the address itself is OpenSSH's (`ssh -G`) where it exists
        config = Config(overrides=overrides, ssh_config=paramiko_config(self._config_paths))
        self.conn = Connection(host.target, user=host.user, port=host.port, config=config, connect_timeout=timeout)
        where = resolve(host)
        self.conn.host, self.conn.port, self.conn.user = where.hostname, where.port, where.user
        for c in [self.conn, *_hops(self.conn)]:  # each hop by its own ssh_config entry
            c.connect_kwargs = {**c.connect_kwargs, "allow_agent": _agent_wanted(host, c.ssh_config)}
        _harden(self.conn, host)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect: each ProxyJump hop first (so a dead bastion is named as the bastion), then the target."""
        if self.conn.is_connected:
            return
        for hop in _hops(self.conn):
            if not hop.is_connected:
                self._open_one(hop, bastion=True)
        self._open_one(self.conn, bastion=False)
        transport = self.conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)

    def _open_one(self, c: Connection, *, bastion: bool) -> None:
        name = self.host.name
        where = f"{c.host}:{c.port}"
        if bastion:
            where = f"ProxyJump bastion {c.original_host} ({where})"
        t = self.host.connect_timeout
        started = time.monotonic()
        log.debug("%s: connecting to %s as %s (agent %s)", name, where, c.user,
                  "on" if c.connect_kwargs.get("allow_agent") else "off")
        try:
            c.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                name,
                f"host key for {where} has CHANGED (got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}); refusing to connect",
                hint=f"if the host was really re-installed, remove its old entry from {self.host.known_hosts}",
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise TransportError(name, f"authentication to {where} as {c.user} failed: {exc}",
                                 hint=self._auth_hint(c)) from exc
        except paramiko.ChannelException as exc:  # the hop before the target could not open a TCP channel to it
            raise TransportError(name, f"the ProxyJump bastion could not reach {c.host}:{c.port}: {exc.text}") from exc
        except paramiko.SSHException as exc:
            text = str(exc)
            if "not found in known_hosts" in text:
                raise HostKeyError(
                    name,
                    f"unknown host key for {where}: not in {self.host.known_hosts}; refusing to connect",
                    hint=f"verify the key, then `ssh-keyscan -p {c.port} {c.host} >> {self.host.known_hosts}`, "
                    "or set trust_on_first_use: true in the host file",
                ) from exc
            if "no authentication methods available" in text.lower():  # paramiko found no key to offer at all
                raise TransportError(name, f"authentication to {where} as {c.user} failed: no key to offer",
                                     hint=self._auth_hint(c)) from exc
            if "no existing session" in text.lower() or ("banner" in text.lower() and time.monotonic() - started >= t):
                # a silent peer: paramiko ends the handshake wait as a missing session (or, later, a banner error)
                raise ConnectFailed(name, f"{where} accepted TCP but completed no SSH handshake (no banner) within "
                                     f"{t:g} s", hint=self._port_hint(bastion)) from exc
            if "banner" in text.lower():  # something that is not sshd answered and hung up (a web server, say)
                raise TransportError(name, f"{where} does not speak SSH (it closed the connection without an SSH "
                                     "banner)", hint=self._port_hint(bastion)) from exc
            raise TransportError(name, f"SSH negotiation with {where} failed: {text}") from exc
        except socket.gaierror as exc:
            raise TransportError(name, f"cannot resolve {c.host}{' for ' + where if bastion else ''}: {exc.strerror}",
                                 hint=self._resolve_hint(c, bastion)) from exc
        except (socket.timeout, TimeoutError) as exc:
            raise ConnectFailed(name, f"connecting to {where} timed out after {t:g} s",
                                 hint=self._bastion_hint() if bastion else None) from exc
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, OSError, EOFError) as exc:
            detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ConnectFailed(name, f"cannot connect to {where}: {detail}",
                                 hint=self._bastion_hint() if bastion else None) from exc
        log.debug("%s: connected to %s in %.2f s", name, where, time.monotonic() - started)

    def _auth_hint(self, c: Connection) -> str:
        agent = "on" if c.connect_kwargs.get("allow_agent") else "off"
        sock = "set" if os.environ.get("SSH_AUTH_SOCK") else "unset"
        keys = ", ".join(c.connect_kwargs.get("key_filename") or []) or "the default ~/.ssh/id_* keys"
        return (f"tried {keys} and ssh-agent ({agent}; SSH_AUTH_SOCK {sock}); check user and identity_file in "
                f"{self.host.source}, or add the key to your agent with ssh-add")

    def _bastion_hint(self) -> str:
        return (f"the target {self.host.target} was not tried: check that the bastion is up and its entry in "
                f"{' or '.join(self._config_paths)}")

    def _port_hint(self, bastion: bool) -> str:
        if bastion:
            return "check the bastion's Port in ssh_config"
        return f"check field 'port' (or the ssh_config entry's Port) in {self.host.source}"

    def _resolve_hint(self, c: Connection, bastion: bool) -> str | None:
        """When the name came from ssh_config, say whether ssh_config defines it at all."""
        alias = c.original_host if bastion else self.host.ssh_alias
        if not alias:
            return f"check field 'address' in {self.host.source}"
        entries = sorted(p for p in c.config.base_ssh_config.get_hostnames() if p != "*" and not p.startswith("!"))
        if any(fnmatch.fnmatch(alias, p) for p in entries):
            return f"ssh_config defines {alias!r} but its HostName {c.host!r} does not resolve"
        files = " or ".join(self._config_paths)
        field = "the ProxyJump entry" if bastion else f"field 'ssh_alias' in {self.host.source}"
        return (f"{alias!r} is not a Host entry of {files} (entries there: {', '.join(entries) or 'none'}); "
                f"fix {field} or add a 'Host {alias}' block")

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

    def _session_channel(self, command: str) -> SessionChannel:
        chan = self._channel()
        try:
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise TransportError(self.host.name, f"cannot start {short(command)}: {exc}") from exc
        return _SSHSessionChannel(chan)

    def _stop_leftover(self, command: str) -> None:
        """Kill what is left of a timed-out ``command`` on the host. Closing its channel is not enough: sshd leaves
        a command without a pty running (a ``sleep`` until it ends; a command that writes until SIGPIPE). It ran in
        a session of its own, started by this connection's sshd; a second channel kills that session's process
        group. Best effort and bounded (a dead connection is not waited for): the timeout is raised either way."""
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            return
        try:
            chan = transport.open_session(timeout=min(_STOP_WAIT, self.host.connect_timeout))
            try:
                chan.exec_command(f'exec {shlex.quote(self.host.python)} -c {shlex.quote(_STOP)} "$PPID" '
                                  f"{shlex.quote(command)}")
                chan.shutdown_write()
                chan.status_event.wait(_STOP_WAIT)
            finally:
                chan.close()
        except Exception as exc:  # noqa: BLE001 - the timeout itself is what gets reported
            log.debug("%s: could not stop the timed-out command: %s", self.host.name, exc)

    # -- commands ------------------------------------------------------------------------------------------------
    def run(
        self,
        command: str,
        *,
        stdin: bytes | Iterable[bytes] | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> RunResult:
        timeout = timeout or self.host.command_timeout
        start = time.monotonic()
        deadline = start + timeout
        chan = self._channel()
        out, err = Capture(STDOUT_MAX), Capture(STDERR_MAX, tail=True)
        try:
            chan.exec_command(command)
            writer = None
            if stdin is None:
                chan.shutdown_write()
            else:
                writer = pump_stdin(stdin, chan.sendall, chan.shutdown_write)
            exited_at: float | None = None
            while True:
                progressed = False
                while chan.recv_ready():
                    if not out.add(chan.recv(CHUNK)):
                        raise output_overflow(self.host.name, short(command))  # closing the channel stops it
                    progressed = True
                while chan.recv_stderr_ready():
                    err.add(chan.recv_stderr(CHUNK))
                    progressed = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the last of the output: the end of the output is the
                    # channel's EOF. A command that left a daemon holding its stdout never sends one, so after the
                    # exit status the output gets a short grace instead of the whole timeout.
                    exited_at = exited_at or time.monotonic()
                    if chan.eof_received or time.monotonic() - exited_at > _EXIT_GRACE:
                        break
                if chan.closed and not chan.recv_ready():
                    break
                if time.monotonic() > deadline:
                    chan.close()
                    self._stop_leftover(command)
                    raise TransportError(self.host.name, f"command timed out after {timeout:g} s: {short(command)}")
                if not progressed:
                    time.sleep(_POLL)
            if writer is not None:
                writer.join(timeout=max(0.1, deadline - time.monotonic()))
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(self.host.name, f"SSH channel failed during {short(command)}: {exc}") from exc
        finally:
            chan.close()
        result = RunResult(command, code, out.value(), err.value(), time.monotonic() - start, err.dropped)
        log.debug("%s: ran %s: exit %s in %.2f s", self.host.name, short(command, 80), code, result.seconds)
        return self.check_failed(result) if check else result

    @contextmanager
    def stream_out(self, command: str, *, timeout: float | None = None) -> Iterator[Any]:
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
                err = Capture(STDERR_MAX, tail=True)
                while chan.recv_stderr_ready() and err.dropped < STDERR_MAX:
                    err.add(chan.recv_stderr(CHUNK))
                raise RemoteError(self.host.name, short(command), f"exit {code}: {err.value().decode(errors='replace')[-2000:]}", kind="exit")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(self.host.name, f"stream from {short(command)} failed: {exc}") from exc
        finally:
            chan.close()


class _DeadlineReader(StreamReader):
    """A channel's stdout with an overall deadline (the channel's own timeout bounds each read)."""

    def __init__(self, chan: paramiko.Channel, deadline: float, host: str, command: str) -> None:
        self.chan, self.deadline, self.host, self.command = chan, deadline, host, command

    def read_chunk(self, size: int) -> bytes:
        if time.monotonic() > self.deadline:
            raise TransportError(self.host, f"stream timed out: {short(self.command)}")
        try:
            return self.chan.recv(size)
        except socket.timeout as exc:
            raise TransportError(self.host, f"no data from {short(self.command)} within the read timeout") from exc


class _SSHSessionChannel(SessionChannel):
    """A session's SSH channel, its paramiko errors seen as OSError (what a session catches)."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return bool(self.chan.closed)

    def _do(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except paramiko.SSHException as exc:
            raise OSError(str(exc)) from exc

    def recv_ready(self) -> bool:
        return self._do(self.chan.recv_ready)

    def recv(self, size: int) -> bytes:
        return self._do(self.chan.recv, size)

    def recv_stderr_ready(self) -> bool:
        return self._do(self.chan.recv_stderr_ready)

    def recv_stderr(self, size: int) -> bytes:
        return self._do(self.chan.recv_stderr, size)

    def exit_status_ready(self) -> bool:
        return self._do(self.chan.exit_status_ready)

    def sendall(self, data: bytes) -> None:
        self._do(self.chan.sendall, data)

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001 - closing a dead channel
            pass
