"""Moving a snapshot's missing blobs from a host into the store: one tar stream, a receiver process, a verdict.

Three steps of one job each: ``_tar_command`` (what the host runs: ``tar -c`` over the list of wanted paths, inline
or uploaded first, ``zstd -1`` when both ends have it), ``_pump`` (the stream read into the receiver with
progress), ``_verdict`` (the receiver's result turned into what was stored, or the error that says whether the link
was cut or the host sent something else). The receiver (``snapshot.receiver``) is a process of its own: it hashes
each blob on arrival and renames it to the path the store gives it (``Store.blob_path``) only when it matches the
manifest.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from ..errors import OperationFailed, RemoteError, TransportError
from ..inventory import Host
from ..transport import HostConnection
from . import receiver as receiver_mod

if TYPE_CHECKING:
    from .progress import Progress, SnapshotStats
    from .store import Store

#: Largest path list sent inline in the tar command (base64 of gzip); larger lists are uploaded to a file first.
_INLINE_LIST_LIMIT = 96_000
_READ = 1 << 20


@dataclass
class _Command:
    """What the host runs to send the blobs, and what to remove there afterwards."""

    line: str
    local_zstd: str | None
    cleanup: str = ""


def fetch_blobs(conn: HostConnection, host: Host, store: Store, wanted: dict[str, str], sizes: dict[str, int],
                report: Progress, stats: SnapshotStats, *, host_zstd: bool = False) -> list[str]:
    """Receive ``wanted`` (path -> sha256) as one tar stream, verifying and storing each blob as it arrives at its
    place in ``store`` (opened for writing by the caller); returns the paths stored (raises when the stream was cut,
    the host sent something else, or a file vanished).

    When both ends have ``zstd`` the stream is compressed (``zstd -1``, about 3x on SGLang): the SSH layer and
    paramiko's per-packet work are the bottleneck, and zstd costs far less CPU than the bytes it saves.
    """
    command = _tar_command(conn, host, wanted, host_zstd)
    stats.wire = "tar+zstd" if command.local_zstd else "tar"
    job_file = store.temporary("job", ".json")
    job_file.write_text(json.dumps({"incoming": str(store.incoming), "wanted": wanted,
                                    "places": {p: str(store.blob_path(sha)) for p, sha in wanted.items()},
                                    "sizes": {p: sizes[p] for p in wanted if p in sizes}}))
    receiver = _Receiver(job_file, command.local_zstd)
    total = sum(sizes.values())
    result: dict[str, Any] = {}
    try:
        with _cut_is_transport_error(host.name, lambda: receiver.pumped), \
                conn.stream_out(command.line, timeout=max(host.command_timeout, 60.0)) as stream:
            _pump(stream, receiver, report, total)
            result = receiver.finish()
            _check_result(host.name, result, receiver.cut, receiver.pumped, len(wanted))
            # the last count: the pump's reports are throttled and, compressed, lag the receiver, so without this the
            # bar could stop short of its total on a transfer that completed
            report("transfer", int(result.get("bytes", 0)), total)
    finally:
        receiver.kill()
        store.remove_temporaries(receiver.pid)
        job_file.unlink(missing_ok=True)
        if command.cleanup:
            try:
                conn.run(f"rm -f {command.cleanup}", timeout=30, check=False)
            except Exception:
                pass
    return _verdict(host.name, wanted, result, receiver.pumped, stats)


def _tar_command(conn: HostConnection, host: Host, wanted: dict[str, str], host_zstd: bool) -> _Command:
    """The host's ``tar -c`` of the wanted paths (NUL-separated, no recursion), the list inline when it fits on a
    command line and uploaded first otherwise (one extra round trip)."""
    listing = "\0".join(sorted(wanted)).encode()
    packed = base64.b64encode(gzip.compress(listing, 6)).decode()
    site = shlex.quote(host.site_packages)
    local_zstd = shutil.which("zstd") if host_zstd and os.environ.get("DDTREE_SNAPSHOT_ZSTD", "1") != "0" else None
    tar = "tar -c -f - --null --no-recursion --no-unquote -T -"
    squeeze = " | zstd -1 -T0 -q -c" if local_zstd else ""
    if len(packed) <= _INLINE_LIST_LIMIT:
        return _Command(f"cd {site} && printf %s {shlex.quote(packed)} | base64 -d | gzip -dc | {tar}{squeeze}", local_zstd)
    remote_list = f"/tmp/.ddtree-snapshot-list-{secrets.token_hex(6)}"
    conn.run(f"cat > {remote_list}", stdin=listing, timeout=60)
    line = (f"cd {site} && {tar.replace('-T -', '-T ' + remote_list)}{squeeze}; rc=$?; rm -f {remote_list}; "
            "exit $rc")
    return _Command(line, local_zstd, cleanup=remote_list)


class _Receiver:
    """The receiver process (``snapshot.receiver``), behind ``zstd -dc`` when the stream is compressed."""

    def __init__(self, job_file: Path, local_zstd: str | None) -> None:
        self.decompress: subprocess.Popen[bytes] | None = None
        if local_zstd:
            self.decompress = subprocess.Popen([local_zstd, "-dc", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL)
        self.stored = _StoredBytes()
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", receiver_mod.__file__, str(job_file),
                                      str(self.stored.fd)],
                                     stdin=self.decompress.stdout if self.decompress else subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(self.stored.fd,))
        self.pid = self.proc.pid
        self.stored.started()
        if self.decompress is not None:
            assert self.decompress.stdout is not None
            self.decompress.stdout.close()  # the receiver holds it now; EOF must reach it when zstd exits
        sink = self.decompress.stdin if self.decompress is not None else self.proc.stdin
        assert sink is not None
        self.sink: IO[bytes] = sink
        self.pumped = 0  # bytes of the stream fed in so far
        self.cut: BaseException | None = None  # why the stream stopped early, when it was the link

    @property
    def compressed(self) -> bool:
        return self.decompress is not None

    def finish(self) -> dict[str, Any]:
        """Close the stream into the receiver and read its result."""
        try:
            self.sink.close()
        except BrokenPipeError:
            pass
        self.proc.stdin = None  # closed above (when it was the sink); communicate() must not flush it
        if self.decompress is not None:
            self.decompress.wait(timeout=300)
        out, err = self.proc.communicate(timeout=300)
        return _receiver_result(out, err, self.proc.returncode)

    def kill(self) -> None:
        for proc in (self.decompress, self.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self.stored.close()


def _pump(stream: IO[bytes], receiver: _Receiver, report: Progress, total: int) -> None:
    """Copy the stream into the receiver (counting ``receiver.pumped``). A receiver that stops early ends it (its
    result says why); a link that fails ends it with ``receiver.cut`` set.

    Progress counts bytes on the wire; compressed, the wire total is not known in advance, so it counts the bytes
    the receiver has stored, against the manifest's total (a real total and ETA either way)."""
    wire_total = 0 if receiver.compressed else total
    report("transfer", 0, total)
    last = 0.0
    try:
        while True:
            chunk = stream.read(_READ)
            if not chunk:
                break
            receiver.sink.write(chunk)
            receiver.pumped += len(chunk)
            now = time.monotonic()
            if now - last > 0.05:
                last = now
                report("transfer", min(receiver.pumped, wire_total) if wire_total else receiver.stored.bytes, total)
    except BrokenPipeError:
        pass  # the receiver stopped early and says why in its result
    except (TransportError, OSError, EOFError) as exc:
        receiver.cut = exc


def _check_result(host_name: str, result: dict[str, Any], cut: BaseException | None, pumped: int, wanted: int) -> None:
    """A cut stream (the link, or a tar that ended early) is a TransportError; anything else the receiver refused
    (a file not asked for, a hash that does not match) refuses the snapshot."""
    if cut is None and "error" not in result:
        return
    why = f"{cut}" if cut is not None else result["error"]
    if cut is not None or result.get("kind") == "truncated":
        raise TransportError(host_name, f"snapshot transfer cut after {pumped} bytes "
                             f"({result.get('stored', 0)}/{wanted} files stored): {why}")
    raise OperationFailed(f"host {host_name}: snapshot refused: {why}")


def _verdict(host_name: str, wanted: dict[str, str], result: dict[str, Any], pumped: int,
             stats: SnapshotStats) -> list[str]:
    """Record what was stored in ``stats``; refuse a snapshot whose files vanished on the host meanwhile."""
    stats.blobs_transferred = result["stored"]
    stats.bytes_transferred = result["bytes"]
    stats.wire_bytes = pumped
    lost = sorted(set(wanted) - set(result["names"]))
    if lost:
        raise OperationFailed(f"host {host_name}: {len(lost)} file(s) vanished during the snapshot, e.g. {lost[0]}; "
                              "is something modifying the installed package? take the snapshot again")
    return list(result["names"])


class _StoredBytes:
    """The receiver's progress pipe: it writes the running count of stored bytes, a thread here keeps the last."""

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self.bytes = 0
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def started(self) -> None:
        os.close(self.fd)  # the receiver holds the write end now; EOF reaches us when it exits
        self.fd = -1
        self._thread.start()

    def _follow(self) -> None:
        with os.fdopen(self._read, "rb") as fh:
            for line in fh:
                try:
                    self.bytes = int(line)
                except ValueError:
                    continue

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._thread.ident is None:
            os.close(self._read)  # never started: no reader owns the read end
        else:
            self._thread.join(timeout=5)


@contextlib.contextmanager
def _cut_is_transport_error(host_name: str, pumped: Callable[[], int]) -> Any:
    """A tar stream that ends at a file boundary looks complete to tar; the missing exit status then says it was cut."""
    try:
        yield
    except RemoteError as exc:
        if "exit -1" not in str(exc):
            raise
        raise TransportError(host_name, f"snapshot transfer cut after {pumped()} bytes: the SSH channel closed "
                             "before tar finished") from exc


def _receiver_result(out: bytes, err: bytes, code: int | None) -> dict[str, Any]:
    try:
        result = json.loads(out.decode() or "null")
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = err.decode(errors="replace").strip()[-1500:]
        return {"error": f"blob receiver exited {code}: {tail or 'no output'}", "kind": "crash", "stored": 0}
    return result
