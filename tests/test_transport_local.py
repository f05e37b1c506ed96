"""What is particular to the local connection (no sshd needed): the host file picks it, a timeout kills what the
command started too, a detached child keeps no command waiting, commands do not inherit our PYTHONPATH, a flood
stays bounded. The contract every transport keeps (exit status, stdin, streams, sessions, ...) is checked in
test_transport_contract.py, against the host ``contract_host`` gives."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import pytest

from ddtree_deploy.errors import RemoteError, TransportError
from ddtree_deploy.inventory import Host
from ddtree_deploy.transport.local import LocalConnection
from ddtree_deploy.transport import STDERR_MAX, STDOUT_MAX, HostConnection


def local_host(root: Path) -> Host:
    site = next(p for p in sys.path if p.endswith("site-packages"))
    return Host(name="here", source="<test>", python=sys.executable, site_packages=site,
                release_root=str(root / "ddtree"), connection="local", command_timeout=30.0)


def contract_host(request: pytest.FixtureRequest) -> Host:
    """The host tests/test_transport_contract.py runs the transport contract against."""
    return local_host(request.getfixturevalue("tmp_path"))


@pytest.fixture()
def host(tmp_path: Path) -> Host:
    return local_host(tmp_path)


def test_the_host_file_picks_the_local_connection(host) -> None:
    assert isinstance(HostConnection(host), LocalConnection)






def test_timeout_ends_the_command_and_what_it_started(host, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    with HostConnection(host) as conn:
        start = time.monotonic()
        with pytest.raises(TransportError, match="timed out after 1 s"):
            conn.run(f"sleep 30 & echo $! > {marker}; wait", timeout=1)
        assert time.monotonic() - start < 8
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_a_detached_child_holding_the_pipes_does_not_hang_the_command(host) -> None:
    """What the server launcher does: the helper exits, the server it started lives on with inherited pipes."""
    with HostConnection(host) as conn:
        start = time.monotonic()
        result = conn.run("setsid sleep 5 & echo started")
        assert result.text().strip() == "started" and time.monotonic() - start < 3






def test_commands_do_not_inherit_our_pythonpath(host, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("DDTREE_MARK", "kept")
    with HostConnection(host) as conn:
        out = conn.run('echo "${PYTHONPATH-unset} $DDTREE_MARK"').text().strip()
    assert out == "unset kept"
    assert os.environ["PYTHONPATH"] == "/somewhere/else"


def test_a_flood_on_stdout_stops_the_command_and_memory_stays_bounded(host) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with HostConnection(host) as conn:
        with pytest.raises(RemoteError, match="printed more than 16 MiB on stdout") as info:
            conn.run("head -c 200000000 /dev/zero")
        assert info.value.kind == "output"
        noisy = conn.run("head -c 3000000 /dev/zero >&2; echo done >&2; exit 4", check=False)
    assert len(noisy.stderr) == STDERR_MAX and noisy.stderr.endswith(b"done\n")
    assert noisy.stderr_dropped == 3000005 - STDERR_MAX
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 3 * STDOUT_MAX, f"peak RSS grew {grown >> 20} MiB"
