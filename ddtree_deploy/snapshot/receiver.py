"""The snapshot's blob receiver: a separate process that reads the tar stream of blobs, hashes each on arrival and
renames it to its place in the store only when it matches the manifest.

It runs as its own process (``python -I -S <this file> JOB PROGRESS_FD``, stdlib only): paramiko decrypts in a
thread of the control process, and per-file work there (open, write, rename: each releases the GIL) would queue
behind it. Out of process it runs on its own CPU, which made the first snapshot of 0.5.23 (5,645 blobs) more than
twice as fast. ``snapshot.transfer`` starts it and feeds it the stream on its stdin.

It knows nothing of the store's layout (``snapshot.store``; it could not import it): the job names the path of
every blob it may store and the directory for its temporaries, which it names ``<its pid>-<random>`` so the
store can tell whether their writer still runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import time
from typing import Any


#: Largest pax or GNU long-name record accepted (they hold a path and a few keys; real ones are under 1 KiB).
META_MAX = 1 << 20
#: Bytes of a member read (hashed and written) at a time: what the receiver holds of a blob, whatever its size.
BODY_CHUNK = 1 << 20


def tar_entries(stream: Any) -> Any:
    """Yield ``(name, typeflag, size, body)`` for each record of a tar stream (ustar, GNU long names, pax headers):
    ``body()`` iterates over the member's data in chunks of at most BODY_CHUNK bytes.

    The caller sees a member's declared size before a byte of its data is read, so it can refuse the member from
    its header; data it does not read is skipped in chunks before the next header. A small reader instead of
    ``tarfile``: the receiver spent most of its time in tarfile's generic header and buffer handling (0.8 s of
    Python for 5,645 members); this keeps the per-member cost at a few slices. Header checksums are verified; a
    stream that ends before the end-of-archive block raises EOFError; a pax or long-name record over META_MAX and
    data declared for anything but a file raise ValueError before it is read.
    """
    def exact(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise EOFError(f"stream ended inside a tar record ({len(data)} of {n} bytes)")
        return data

    def chunks(size: int) -> Any:
        left = size
        while left:
            data = exact(min(left, BODY_CHUNK))
            left -= len(data)
            yield data
        if size % 512:
            exact(512 - size % 512)

    def pax_records(data: bytes) -> dict[str, str]:
        out, pos = {}, 0
        while pos < len(data):
            space = data.index(b" ", pos)
            length = int(data[pos:space])
            key, _, value = data[space + 1:pos + length - 1].partition(b"=")
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
            pos += length
        return out

    long_name = None
    pax: dict[str, str] = {}
    while True:
        header = stream.read(512)
        if len(header) != 512:
            raise EOFError("stream ended before the end-of-archive block")
        if header == b"\0" * 512:
            return
        recorded = int(header[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
        if recorded != sum(header[:148]) + 256 + sum(header[156:]):
            raise ValueError("corrupt tar header (checksum mismatch)")
        flag = header[156:157]
        field = header[124:136]
        size = int.from_bytes(field[1:], "big") if field[0] & 0x80 else int(field.split(b"\0", 1)[0].strip() or b"0", 8)
        if "size" in pax and flag not in (b"x", b"g", b"L"):
            size = int(pax["size"])
        if flag in (b"x", b"g", b"L"):
            if size > META_MAX:
                raise ValueError(f"a tar header record declares {size} bytes (over the {META_MAX}-byte limit): refused "
                                 "before reading it")
            data = b"".join(chunks(size))
            if flag == b"L":
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif flag == b"x":
                pax = pax_records(data)
            continue
        name = header[:100].split(b"\0", 1)[0]
        prefix = header[345:500].split(b"\0", 1)[0] if header[257:263] == b"ustar\0" else b""
        text = (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")
        text = pax.get("path", long_name if long_name is not None else text)
        long_name, pax = None, {}
        if flag not in (b"0", b"\0", b"7") and size:
            raise ValueError(f"tar member {text!r} (type {flag.decode(errors='replace')!r}) declares {size} bytes of "
                             "data, but only files carry data: refused before reading it")
        body = chunks(size)
        yield text, flag, size, lambda body=body: body
        for _ in body:  # what the caller did not read, skipped a chunk at a time
            pass


def receive_blobs(incoming: str, wanted: dict[str, str], places: dict[str, str], stream: Any,
                  on_stored: Any = None, sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """Read a tar stream, storing each wanted regular file (``wanted``: name -> sha256) at its place in the store
    (``places``: name -> blob path) once its hash matched.

    Runs in a child process (this file run as a script: see ``main``). Member names are only looked up in
    ``wanted``, never used as paths, so a hostile or broken host cannot write outside the store. Each member is
    judged from its header before its data is read: a name not asked for, or a size other than the manifest's
    (``sizes``), is refused there, so a member declared at 1.5 GB costs nothing. Its data is hashed and written a
    chunk at a time under ``incoming/<pid>-<random>`` and renamed into place only after verification: a cut stream
    or a hash that does not match leaves at most that temporary file, which is removed here or, if this process
    is killed, by the parent.
    """
    names: list[str] = []
    total = 0
    sizes = sizes or {}
    for name, flag, size, body in tar_entries(stream):
        if flag not in (b"0", b"\0", b"7"):  # regular files only; directories and links were not asked for
            continue
        expected = wanted.get(name)
        if expected is None:
            raise ValueError(f"tar stream held a file that was not asked for: {name!r} ({size} bytes declared; "
                             "refused from its header)")
        if size != sizes.get(name, size):
            raise ValueError(f"{name}: the tar stream declares {size} bytes, the manifest says {sizes[name]}: refused "
                             "from its header (it changed on the host during the snapshot, or the host sent something "
                             "else); take it again")
        tmp = os.path.join(incoming, f"{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)  # read-only from birth
        try:
            h = hashlib.sha256()
            try:
                for data in body():
                    h.update(data)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            digest = h.hexdigest()
            if digest != expected:
                raise ValueError(f"{name} arrived with sha256 {digest[:16]}..., the manifest says {expected[:16]}...: "
                                 "it changed on the host during the snapshot; take it again")
            os.replace(tmp, places[name])
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        names.append(name)
        total += size
        if on_stored is not None:
            on_stored(total)
    return {"stored": len(names), "bytes": total, "names": names}


def main(argv: list[str]) -> None:
    """``argv``: the job file (incoming, wanted, places, sizes) and the fd of the progress pipe. Writes one JSON result
    (stored, bytes, names; or error and kind) on stdout."""
    data = open(0, "rb", buffering=1 << 20, closefd=False)
    with open(argv[1]) as fh:
        job = json.load(fh)
    progress_fd = int(argv[2]) if len(argv) > 2 else None
    last = 0.0

    def stored(total: int) -> None:
        # bytes of file content stored so far, on the progress pipe (at most every 50 ms): the parent's progress bar
        # has a real total and ETA even when the wire carries compressed bytes
        nonlocal last
        now = time.monotonic()
        if now - last >= 0.05:
            last = now
            try:
                os.write(progress_fd, b"%d\n" % total)  # type: ignore[arg-type]
            except OSError:
                pass

    try:
        result = receive_blobs(job["incoming"], job["wanted"], job["places"], data,
                               stored if progress_fd is not None else None, job.get("sizes"))
    except EOFError as exc:
        result = {"error": "stream ended early: %s" % exc, "kind": "truncated"}
    except Exception as exc:
        result = {"error": str(exc), "kind": type(exc).__name__}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
