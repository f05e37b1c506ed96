"""The transport contract, run against every registered transport (``ddtree_deploy.transport.TRANSPORTS``): exit
status, stdin (binary, never ours), binary streams both ways, timeouts that end the whole command, the session
channel (in, out, EOF when the control side closes), tar streams, the remote helper's reply protocol.

Each kind is checked on a real host of its own: ``tests/test_transport_<kind>.py`` defines
``contract_host(request) -> Host`` (and, optionally, ``CONTRACT_MARKS``, e.g. the sandbox mark for a host the suite
starts; ``CONTRACT_KNOWN_GAPS``: test name -> why that part of the contract does not hold yet, a strict xfail).
A transport registered without that file fails here, by name. Transport-specific checks (host keys,
ProxyJump, the local environment, ...) stay in those files.
"""

from __future__ import annotations

import importlib
import io
import json
import shlex
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from ddtree_deploy.errors import InputError, OperationFailed, RemoteError, TransportError
from ddtree_deploy.inventory import Host
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.remote import RESULT_MARKER
from ddtree_deploy.transport import TRANSPORTS, HostConnection, RemoteSession, connect, transport_class
from ddtree_deploy.transport.local import LocalConnection

#: Binary on purpose: NUL, high bytes, no newline at the end, every byte value.
PAYLOAD = b"\x00\xff\x00\x80" + bytes(range(256)) * 4096 + b"\xfe\x00"


def _test_module(kind: str):
    try:
        return importlib.import_module(f"test_transport_{kind}")
    except ImportError:
        return None


def _kinds() -> list:
    params = []
    for kind in TRANSPORTS:
        mod = _test_module(kind)
        params.append(pytest.param(kind, id=kind, marks=list(getattr(mod, "CONTRACT_MARKS", ()))))
    return params


@pytest.fixture(params=_kinds())
def kind(request) -> str:
    return request.param


@pytest.fixture()
def host(kind: str, request) -> Host:
    mod = _test_module(kind)
    gap = getattr(mod, "CONTRACT_KNOWN_GAPS", {}).get(request.node.originalname)
    if gap:  # a part of the contract this transport does not keep yet: must fail, so fixing it is noticed
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
    if mod is None or not hasattr(mod, "contract_host"):
        pytest.fail(f"transport {kind!r} is registered but tests/test_transport_{kind}.py defines no "
                    "contract_host(request): the contract suite has no host to run it against")
    got = mod.contract_host(request)
    assert got.connection == kind
    return got


@pytest.fixture()
def conn(host: Host) -> Iterator[HostConnection]:
    with HostConnection(host) as c:
        yield c


@pytest.fixture()
def scratch(conn: HostConnection) -> Iterator[str]:
    """A fresh directory on the host."""
    path = conn.run("mktemp -d /tmp/contract.XXXXXX").text().strip()
    assert path.startswith("/tmp/contract.")
    yield path
    conn.run(f"rm -rf {shlex.quote(path)}", check=False)


def test_the_registry_gives_the_kinds_class(kind: str, host: Host) -> None:
    cls = transport_class(kind)
    assert type(HostConnection(host)) is cls and type(connect(host)) is cls
    assert issubclass(cls, HostConnection) and isinstance(cls.holds_session, bool)


def test_exit_status_and_separate_streams(conn: HostConnection) -> None:
    result = conn.run("echo hello; echo oops >&2")
    assert result.ok and result.text() == "hello\n" and result.stderr == b"oops\n"
    failed = conn.run("echo bad >&2; exit 7", check=False)
    assert failed.exit_code == 7 and not failed.ok and failed.stderr == b"bad\n"
    with pytest.raises(RemoteError, match="exit 7: bad") as info:
        conn.run("echo bad >&2; exit 7")
    assert info.value.kind == "exit"


def test_stdin_bytes_come_back_exactly_and_ours_is_never_forwarded(conn: HostConnection) -> None:
    assert conn.run("cat", stdin=PAYLOAD).stdout == PAYLOAD
    chunks = [PAYLOAD[i:i + 5000] for i in range(0, len(PAYLOAD), 5000)]
    assert conn.run("cat", stdin=iter([b"", *chunks, b""])).stdout == PAYLOAD
    # no stdin given: the command sees EOF at once, never this process's stdin
    assert conn.run("cat | wc -c", timeout=10).text().strip() == "0"


def test_binary_streams_in_and_out_byte_for_byte(conn: HostConnection, scratch: str) -> None:
    chunks = [PAYLOAD[i:i + 7001] for i in range(0, len(PAYLOAD), 7001)]
    sent = conn.send_stream(f"cat > {scratch}/blob", iter(chunks))
    assert sent.ok
    assert conn.run(f"wc -c < {scratch}/blob").text().strip() == str(len(PAYLOAD))
    with conn.stream_out(f"cat {scratch}/blob") as stream:
        first = stream.read(3)
        rest = stream.read()
    assert first + rest == PAYLOAD
    with pytest.raises(RemoteError, match="exit 2"):
        with conn.stream_out("echo partial; exit 2") as stream:
            stream.read()


def test_a_timeout_ends_the_whole_command(conn: HostConnection) -> None:
    marker = f"30.{uuid.uuid4().int % 10 ** 9:09d}"  # a unique sleep length: the process is found by it
    pattern = shlex.quote(f"sleep {marker.replace('.', '[.]')}")  # [.]: pgrep's own command line never matches
    start = time.monotonic()
    with pytest.raises(TransportError, match="timed out after 1 s"):
        conn.run(f"sleep {marker}; echo x", timeout=1)
    assert time.monotonic() - start < 6
    deadline = time.monotonic() + 5
    while (left := conn.run(f"pgrep -f {pattern}", check=False)).exit_code == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left.exit_code == 1, f"still running after the timeout: pids {left.text().split()}"
    assert time.monotonic() - start < 12


def test_the_session_channel_carries_lines_both_ways_and_eof_ends_it(kind: str, conn: HostConnection,
                                                                     scratch: str) -> None:
    if not conn.holds_session:
        pytest.skip(f"{kind} holds no session: test_the_lock_refuses_a_transport_that_cannot_hold_a_session")
    # the host side: answer the first line with a reply line, then read until EOF and note it
    program = (f'read line; printf "%s%s\\n" {shlex.quote(RESULT_MARKER)} "$line"; '
               f"cat > {scratch}/rest; echo eof > {scratch}/ended")
    chan = conn._session_channel(program)
    session = RemoteSession(chan, conn.host.name, "contract.echo")
    try:
        assert session.send(json.dumps({"ok": True, "result": {"n": 1}}))
        assert session.reply(timeout=20) == {"n": 1}
        assert session.send("hb") and session.send("hb")
        time.sleep(0.3)
        assert conn.run(f"cat {scratch}/ended 2>/dev/null || echo running").text() == "running\n"
    finally:
        session.close()  # the control side goes away: the host side must see the end of its input
    deadline = time.monotonic() + 10
    while (ended := conn.run(f"cat {scratch}/ended", check=False)).exit_code and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended.text() == "eof\n"
    assert conn.run(f"cat {scratch}/rest").text() == "hb\nhb\n"


def test_a_session_that_ends_without_an_answer_is_a_transport_error(kind: str, conn: HostConnection) -> None:
    if not conn.holds_session:
        pytest.skip(f"{kind} holds no session")
    session = RemoteSession(conn._session_channel("echo 'no such op' >&2; exit 3"), conn.host.name, "contract.x")
    try:
        with pytest.raises(TransportError, match="ended without an answer"):
            session.reply(timeout=20)
    finally:
        session.close()


def test_tar_streams_both_ways(conn: HostConnection, scratch: str) -> None:
    """A tar archive fed in small chunks is unpacked on the host, then streamed back out byte for byte."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(20):
            data = (f"file {i}\n" * (i + 1) * 500).encode()
            info = tarfile.TarInfo(f"d/f{i}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("d/blob.bin")
        info.size = len(PAYLOAD)
        tar.addfile(info, io.BytesIO(PAYLOAD))
    raw = buf.getvalue()
    conn.send_stream(f"tar -x -C {scratch}", [raw[i:i + 7000] for i in range(0, len(raw), 7000)])
    with conn.stream_out(f"tar -c -C {scratch} d") as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert len(got) == 21
    assert got["d/f3.txt"] == ("file 3\n" * 4 * 500).encode()
    assert got["d/blob.bin"] == PAYLOAD


def test_remote_helper_round_trip_and_errors(conn: HostConnection, host: Host) -> None:
    info = conn.call("hostinfo", "check", site_packages=host.site_packages)
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    with pytest.raises(RemoteError, match="unknown op 'nope'"):
        conn.call("hostinfo", "nope")


class _NoSession(LocalConnection):
    """A transport that cannot hold a session (what a one-shot transport would be)."""

    holds_session = False


def test_the_lock_refuses_a_transport_that_cannot_hold_a_session(tmp_path: Path) -> None:
    site = next(p for p in sys.path if p.endswith("site-packages"))
    host = Host(name="oneshot", source="<test>", python=sys.executable, site_packages=site,
                release_root=str(tmp_path / "ddtree"), connection="oneshot", command_timeout=30.0)
    with _NoSession(host) as conn:
        with pytest.raises(OperationFailed, match=r"host oneshot: .*'oneshot' transport \(_NoSession\) cannot hold"):
            ReleaseManager(conn, run_id="run-x").acquire("ddtree-deploy apply")
    assert not (tmp_path / "ddtree" / "lock").exists()


def test_the_host_files_connection_choices_are_the_registry(tmp_path: Path) -> None:
    """A kind is a host file's ``connection`` from the moment it is registered: no change to the inventory or to the
    committed JSON Schema (where ``connection`` is a string, the kinds its examples), and a kind not registered is
    refused naming the ones that are."""
    import jsonschema
    import yaml

    from ddtree_deploy.inventory import host_file_schema, load_host_file
    from ddtree_deploy.transport import register

    site = next(p for p in sys.path if p.endswith("site-packages"))
    doc = {"connection": "other", "address": "h", "python": sys.executable, "site_packages": site,
           "release_root": str(tmp_path / "ddtree")}
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"h.yaml: field 'connection': expected one of 'ssh', 'local', got 'other'"):
        load_host_file(path)
    with pytest.raises(ValueError, match=r"unknown connection 'other' \(known: ssh, local"):
        transport_class("other")
    committed = json.loads((Path(__file__).resolve().parent.parent / "hosts" / "host.schema.json").read_text())
    register("other", "local:LocalConnection")
    try:
        host = load_host_file(path)
        assert host.connection == "other" and transport_class("other") is LocalConnection
        assert host_file_schema()["properties"]["connection"]["examples"] == list(TRANSPORTS)
        assert not list(jsonschema.Draft202012Validator(committed).iter_errors(doc)), "the committed schema takes it"
    finally:
        del TRANSPORTS["other"]
    assert committed["properties"]["connection"]["type"] == "string" and "enum" not in committed["properties"][
        "connection"]
