"""Errors that carry the CLI exit code they map to.

Every failure a user can cause or meet names the file, host or field involved; the CLI prints the message and
exits with the code below, so scripts can tell "bad input" from "host down" from "ABI mismatch".
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # operation failed (probe failed, rolled back)
EXIT_USAGE = 2  # usage or bad input (inventory, patch set)
EXIT_UNREACHABLE = 3  # host unreachable or SSH failure
EXIT_ABI = 4  # ABI incompatibility
EXIT_PATCH = 5  # patch does not apply to this base
EXIT_LOCKED = 6  # another run holds the host's deploy lock: nothing was changed; wait, or --break-lock if it is dead
EXIT_INTERRUPTED = 130  # interrupted (Ctrl-C, SIGTERM): the host was settled (rolled back) before we exited


class DeployError(Exception):
    """Base class: a failure with a message meant for the user and an exit code."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class OperationFailed(DeployError):
    exit_code = EXIT_FAILED


class InputError(DeployError):
    """Bad input: an inventory file, a patch set, a flag. The message names the file and field."""

    exit_code = EXIT_USAGE


class TransportError(DeployError):
    """The host could not be reached, refused us, or a command on it timed out."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"host {host}: {message}", hint=hint)
        self.host = host


class ConnectionCut(TransportError):
    """The connection died in the middle of a run; the message says what the host did about it."""


class Interrupted(DeployError):
    """Ctrl-C or SIGTERM during a run; the message says how the host was settled."""

    exit_code = EXIT_INTERRUPTED


class ConnectFailed(TransportError):
    """No SSH session could be opened: the TCP connection was refused, reset or timed out, or the peer sent no
    banner. Nothing ran on the host, so the attempt may be repeated (a fleet retries it once: fleet.py). Not an
    authentication or host-key failure, and not a name that does not resolve: those do not get better by waiting."""


class HostKeyError(TransportError):
    """The host's key is unknown or changed; we never connect to such a host silently."""


class RemoteError(OperationFailed):
    """The remote helper program ran but reported a failure."""

    def __init__(self, host: str, op: str, message: str, kind: str = "error") -> None:
        super().__init__(f"host {host}: remote {op} failed: {message}")
        self.host = host
        self.op = op
        self.kind = kind


class LockHeld(OperationFailed):
    """Another run holds the host's deploy lock (or a dead run left it behind); nothing was changed."""

    exit_code = EXIT_LOCKED


class Fenced(OperationFailed):
    """This run no longer holds the host lock (the host gave it up and settled it); nothing more was changed."""


def is_cut(exc: BaseException) -> bool:
    """The run lost its host: the connection dropped (a remote step ended with no exit status, or the channel
    failed), or the host already gave the run up (its guardian saw the connection go). Not a timeout."""
    if isinstance(exc, Fenced):
        return True
    if isinstance(exc, TransportError):
        return "timed out" not in exc.message
    return isinstance(exc, RemoteError) and exc.kind == "crash" and "exited -1" in str(exc)


class AbiIncompatible(DeployError):
    exit_code = EXIT_ABI


class PatchDoesNotApply(DeployError):
    exit_code = EXIT_PATCH
