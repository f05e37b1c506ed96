"""Checks every transport must pass the same way (SSH in test_transport.py, local in test_transport_local.py)."""

from __future__ import annotations

import io
import tarfile

from ddtree_deploy.transport import HostConnection


def check_tar_streams_both_ways(conn: HostConnection, directory: str) -> None:
    """A tar archive fed in small chunks is unpacked on the host, then streamed back out byte for byte."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(20):
            data = (f"file {i}\n" * (i + 1) * 500).encode()
            info = tarfile.TarInfo(f"d/f{i}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    conn.run(f"rm -rf {directory} && mkdir -p {directory}")
    conn.send_stream(f"tar -x -C {directory}", [raw[i:i + 7000] for i in range(0, len(raw), 7000)])
    with conn.stream_out(f"tar -c -C {directory} d") as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert len(got) == 20
    assert got["d/f3.txt"] == ("file 3\n" * 4 * 500).encode()
