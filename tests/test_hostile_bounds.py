"""Hostile inputs bounded, piece by piece (the whole path through the installed CLI is tests/cli/test_cli_hostile.py):
a tar member judged from its header, output kept to its cap (a local command flooding stdout:
test_transport_local.py), replies against their schema, and the host's resolved paths judged with both spellings.
Fast: no sandbox."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from ddtree_deploy import hostpaths
from ddtree_deploy.errors import InputError, OperationFailed, RemoteError
from ddtree_deploy.inventory import Host
from ddtree_deploy.replies import REPLY_MAX, parse
from ddtree_deploy.snapshot import SnapshotStore
from ddtree_deploy.snapshot.manifest import check_manifest
from ddtree_deploy.snapshot.receiver import receive_blobs
from ddtree_deploy.snapshot.store import Store
from ddtree_deploy.transport import Capture


class Counting(io.RawIOBase):
    """A stream of one tar header followed by endless zeros, counting what was read."""

    def __init__(self, header: bytes) -> None:
        self.data, self.read_bytes = header, 0

    def read(self, n: int = -1) -> bytes:
        self.read_bytes += n
        head, self.data = self.data[:n], self.data[n:]
        return head + bytes(n - len(head))


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


@pytest.mark.parametrize("name,size,kind,why", [
    ("sglang/a.py", 1536 << 20, tarfile.REGTYPE, "declares 1610612736 bytes, the manifest says 10"),
    ("sglang/evil.py", 1536 << 20, tarfile.REGTYPE, "not asked for"),
    ("sglang/dir", 1536 << 20, tarfile.DIRTYPE, "only files carry data"),
])
def test_a_tar_member_is_refused_from_its_header(tmp_path: Path, name, size, kind, why) -> None:
    stream = Counting(_header(name, size, kind))
    with pytest.raises(ValueError, match=why):
        receive_blobs(str(tmp_path), {"sglang/a.py": "0" * 64}, {"sglang/a.py": str(tmp_path / ("0" * 64))}, stream,
                      sizes={"sglang/a.py": 10})
    assert stream.read_bytes <= 1024  # the header (and, for a GNU long name, its record): never the data
    assert list(tmp_path.iterdir()) == []


def test_a_pax_record_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    stream = Counting(_header("././@PaxHeader", 64 << 20, tarfile.XHDTYPE))
    with pytest.raises(ValueError, match="over the 1048576-byte limit"):
        receive_blobs(str(tmp_path), {}, {}, stream)
    assert stream.read_bytes == 512


def test_blobs_are_stored_a_chunk_at_a_time_and_verified(tmp_path: Path) -> None:
    files = {"sglang/small.py": b"x = 1\n", "sglang/big.bin": bytes(range(256)) * (12 << 12)}  # 12 MiB
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    wanted = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    store = Store(tmp_path / "store")
    store.open_for_write()
    buf.seek(0)
    got = receive_blobs(str(store.incoming), wanted, {p: str(store.blob_path(s)) for p, s in wanted.items()}, buf,
                        sizes={p: len(d) for p, d in files.items()})
    assert got["stored"] == 2 and got["bytes"] == sum(map(len, files.values()))
    assert {store.blob_path(s).read_bytes() for s in wanted.values()} == set(files.values())
    buf.seek(0)
    bad = {**wanted, "sglang/small.py": "0" * 64}
    with pytest.raises(ValueError, match="arrived with sha256"):
        receive_blobs(str(store.incoming), bad, {p: str(store.blob_path(s)) for p, s in bad.items()},
                      buf, sizes={p: len(d) for p, d in files.items()})
    assert store.temporaries() == [] and not store.has_blob("0" * 64)


@pytest.mark.parametrize("sha", ["../../victim", "<absolute>", "A" * 64, "0" * 63, ""])
def test_a_content_hash_that_is_not_a_sha256_is_refused_before_it_names_a_file(tmp_path: Path, sha: str) -> None:
    """A host that names a file's content ``../../victim`` (or an absolute path) would make the store's check of the
    blobs it holds stat, hash and remove that file: the manifest is refused on arrival, and the store refuses the
    name as well."""
    victim = tmp_path / "victim"  # what the store's objects/../../victim names
    victim.write_text("kept")
    sha = str(victim) if sha == "<absolute>" else sha
    raw = {"files": {"sglang/__init__.py": [hashlib.sha256(b"").hexdigest(), 0, 0o644],
                     "sglang/version.py": [sha, 4, 0o644]}, "links": {}}
    with pytest.raises(OperationFailed, match=r"'sglang/version.py' the content hash .* is not a sha256") as info:
        check_manifest("gpu1", "sglang", raw)
    assert "refusing the snapshot (nothing was stored)" in str(info.value)
    store = SnapshotStore(tmp_path / "store")
    store.open_for_write()
    with pytest.raises(InputError, match="is not a sha256"):
        store.intact_blobs({sha: 4})
    assert victim.read_text() == "kept"


def test_capture_keeps_a_head_or_a_tail() -> None:
    head, tail = Capture(10), Capture(10, tail=True)
    assert head.add(b"12345") and not head.add(b"6789abcdef")
    assert head.value() == b"123456789a" and head.dropped == 5
    for chunk in (b"12345", b"6789abcdef"):
        assert tail.add(chunk)
    assert tail.value() == b"6789abcdef" and tail.dropped == 5


@pytest.mark.parametrize("line,why", [
    (b"{broken", "the reply: Invalid JSON"),
    (b"[1, 2]", "the reply: Input should be an object"),
    (b'{"ok": "yes"}', "ok: Input should be a valid boolean"),
    (b'{"ok": true, "result": 5}', "the result: Input should be a valid dictionary"),
    (b'{"ok": true, "result": {"hostname": "h"}}', "result.python: Field required"),
    (b'{"ok": true, "result": "' + b"x" * (REPLY_MAX + 1) + b'"}', "over the 8 MiB cap"),
])
def test_a_malformed_reply_names_the_host_and_the_op(line, why) -> None:
    with pytest.raises(RemoteError) as info:
        parse("gpu1", "hostinfo.check", line)
    assert info.value.kind == "reply"
    assert str(info.value).startswith("host gpu1: remote hostinfo.check failed: malformed reply") and why in str(info.value)


def test_a_failure_the_reply_reports_keeps_its_kind() -> None:
    with pytest.raises(RemoteError, match="no space left") as info:
        parse("gpu1", "release.switch", b'{"ok": false, "error": "no space left", "kind": "disk"}')
    assert info.value.kind == "disk"


SITE = "/venv/lib/python3.11/site-packages"


def _resolved(root: str, links: dict[str, str] | None = None) -> dict:
    return {"release_root": root, "site_packages": SITE, "package": f"{SITE}/sglang", "python": "/usr/bin/python3.11",
            "executable": "/usr/bin/python3.11", "links": links or {}}


@pytest.mark.parametrize("given,real", [
    (f"{SITE.replace('/lib/', '/lib64/')}/rel", f"{SITE}/rel"),
    ("/srv/into-package/../rel", f"{SITE}/sglang/rel"),
    ("/srv/link/", f"{SITE}/sglang/srt"),
])
def test_a_root_the_host_resolves_into_site_packages_is_refused_with_both_spellings(tmp_path, given, real) -> None:
    host = Host(name="gpu1", source=str(tmp_path / "gpu1.yaml"), python="/venv/bin/python", site_packages=SITE,
                release_root=given)
    with pytest.raises(InputError) as info:
        hostpaths.check(None, host, _resolved(real))
    text = str(info.value)
    assert repr(given) in text and repr(real) in text and "gpu1.yaml" in text and "nothing was written" in text
    assert info.value.exit_code == 2


def test_a_symlink_among_the_root_entries_is_refused_and_a_good_root_passes(tmp_path) -> None:
    host = Host(name="gpu1", source="gpu1.yaml", python="/venv/bin/python", site_packages=SITE, release_root="/opt/dd")
    assert hostpaths.check(None, host, _resolved("/opt/dd", {"current": "/opt/dd/base"})) is not None
    with pytest.raises(InputError, match="its entry 'releases' is a symlink to '/venv/lib/python3.11/site-packages"):
        hostpaths.check(None, host, _resolved("/opt/dd", {"releases": f"{SITE}/sglang"}))
