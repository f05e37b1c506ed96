"""The SSH transport against real sshd sandbox hosts: commands, streams, the remote helper, and every refusal."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from ddtree_deploy.errors import HostKeyError, TransportError
from ddtree_deploy.transport import HostConnection

pytestmark = pytest.mark.sandbox
#: tests/test_transport_contract.py runs the transport contract against a sandbox sshd host.
CONTRACT_MARKS = [pytest.mark.sandbox]


def contract_host(request: pytest.FixtureRequest):
    return request.getfixturevalue("sandbox").base






def test_hosts_have_their_own_files(sandbox) -> None:
    with HostConnection(sandbox.base) as a, HostConnection(sandbox.drift) as b:
        a.run("echo base > /srv/ddtree-host/whoami")
        b.run("echo drift > /srv/ddtree-host/whoami")
        assert a.run("cat /srv/ddtree-host/whoami").text() == "base\n"
        assert b.run("cat /srv/ddtree-host/whoami").text() == "drift\n"




def test_remote_helper_round_trip(sandbox) -> None:
    with HostConnection(sandbox.drift) as conn:
        info = conn.call("hostinfo", "check", site_packages=sandbox.drift.site_packages)
    assert info["sglang"] == "0.5.23"
    assert info["sglang_dir_exists"] is True
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))






def test_unknown_host_key_refused(sandbox, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = dataclasses.replace(sandbox.base, known_hosts=str(empty))
    with pytest.raises(HostKeyError, match="unknown host key") as info:
        HostConnection(host).open()
    assert "ssh-keyscan" in str(info.value)
    assert empty.read_text() == ""


def test_changed_host_key_refused_even_with_trust_on_first_use(sandbox, tmp_path: Path) -> None:
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    assert other.returncode == 0
    pub = (tmp_path / "k.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sandbox.base.port} {pub[0]} {pub[1]}\n")
    host = dataclasses.replace(sandbox.base, known_hosts=str(known), trust_on_first_use=True)
    with pytest.raises(HostKeyError, match="CHANGED"):
        HostConnection(host).open()


def test_trust_on_first_use_records_the_key_once(sandbox, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    host = dataclasses.replace(sandbox.base, known_hosts=str(known), trust_on_first_use=True)
    with HostConnection(host) as conn:
        assert conn.run("true").ok
    recorded = known.read_text()
    assert f"[127.0.0.1]:{sandbox.base.port} ssh-ed25519 " in recorded
    strict = dataclasses.replace(host, trust_on_first_use=False)
    with HostConnection(strict) as conn:  # the recorded key now satisfies strict checking
        assert conn.run("true").ok


def test_silent_tcp_peer_times_out_within_connect_timeout(sandbox) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    host = dataclasses.replace(sandbox.base, port=listener.getsockname()[1], connect_timeout=1.5)
    start = time.monotonic()
    try:
        with pytest.raises(TransportError, match=r"no SSH handshake \(no banner\) within 1.5 s"):
            HostConnection(host).open()
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        thread.join()
        listener.close()
        for s in accepted:
            s.close()
    assert elapsed < 1.5 + 3.0, f"took {elapsed:.1f} s for a 1.5 s connect timeout"


def test_proxyjump_from_ssh_config_is_honoured(sandbox, tmp_path: Path) -> None:
    """Reach the base host through the drift host as a jump host, as ssh_config says."""
    key = sandbox.base.identity_file
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {sandbox.drift.port}\n  User root\n  IdentityFile {key}\n\n"
        f"Host behind\n  HostName 127.0.0.1\n  Port {sandbox.base.port}\n  User root\n  IdentityFile {key}\n  ProxyJump jumpbox\n"
    )
    host = dataclasses.replace(sandbox.base, address=None, ssh_alias="behind", ssh_config=str(config), port=None, user=None)
    with HostConnection(host) as conn:
        assert conn.conn.gateway is not None
        assert conn.run("cat /srv/ddtree-host/.sglang-installed").text().strip() == "0.5.11"


def test_unreachable_host_exits_3_fast(sandbox, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    doc = yaml.safe_load(Path(sandbox.base.source).read_text())
    doc.update(name="gone", port=closed_port)
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "gone.yaml").write_text(yaml.safe_dump(doc))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ddtree_deploy", "hosts", "check", "--inventory", str(inv), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "cannot connect to 127.0.0.1" in proc.stdout
    assert time.monotonic() - start < 30


def test_hosts_check_cli_reports_versions(sandbox) -> None:
    proc = subprocess.run([sys.executable, "-m", "ddtree_deploy", "hosts", "check", "--inventory", str(sandbox.inventory), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {r["host"]: r for r in yaml.safe_load(proc.stdout)}
    assert rows["sandbox-base"]["sglang"] == "0.5.11"
    assert rows["sandbox-drift"]["sglang"] == "0.5.23"


def _alias_host(config: Path, alias: str, **fields):
    from ddtree_deploy.inventory import Host

    return Host(name="h", source="h.yaml", python="/usr/bin/python3", site_packages="/x", release_root="/r",
                ssh_alias=alias, ssh_config=str(config), **fields)


def test_ssh_config_include_is_expanded_as_openssh_does(tmp_path: Path, monkeypatch) -> None:
    """Relative Include paths from ~/.ssh, globs in sorted order, nesting; the first value of a key wins; and
    `ssh -G` and the paramiko fallback agree on HostName, Port and User."""
    from ddtree_deploy import ssh_config

    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / ".ssh" / "conf.d" / "10-lab.conf").write_text("Host lab\n  HostName 10.1.2.3\n  Include nested.conf\n")
    (home / ".ssh" / "nested.conf").write_text("  Port 2201\n  User ops\n")
    (home / ".ssh" / "conf.d" / "20-late.conf").write_text("Host lab late\n  Port 9999\n")
    config = tmp_path / "config"
    config.write_text("Include conf.d/*.conf\nHost *\n  User nobody\n")
    assert ssh_config.entries([str(config)]) == ["lab", "late"]
    text = ssh_config.expanded_text([str(config)])
    assert text.index("10.1.2.3") < text.index("Port 2201") < text.index("Port 9999")
    host = _alias_host(config, "lab")
    by_ssh = ssh_config._resolve(host.target, host.ssh_config, None, None, host.source, "/usr/bin/ssh")
    by_paramiko = ssh_config._resolve(host.target, host.ssh_config, None, None, host.source, None)
    assert (by_ssh.by, by_paramiko.by) == ("ssh -G", "paramiko")
    assert (by_ssh.hostname, by_ssh.port, by_ssh.user) == ("10.1.2.3", 2201, "ops")
    assert (by_paramiko.hostname, by_paramiko.port, by_paramiko.user) == ("10.1.2.3", 2201, "ops")
    late = ssh_config._resolve("late", str(config), None, None, "h.yaml", "/usr/bin/ssh")
    assert (late.port, late.user) == (9999, "nobody")
    # the host file's own port and user win over ssh_config's, on both paths
    for ssh in ("/usr/bin/ssh", None):
        mine = ssh_config._resolve("lab", str(config), 2022, "me", "h.yaml", ssh)
        assert (mine.port, mine.user) == (2022, "me")


def test_a_broken_ssh_config_is_an_input_error_naming_the_host_file(tmp_path: Path) -> None:
    from ddtree_deploy import ssh_config
    from ddtree_deploy.errors import InputError

    config = tmp_path / "config"
    config.write_text("Host lab\n  NoSuchKeyword yes\n")
    with pytest.raises(InputError, match=r"h\.yaml: ssh_config of 'lab' cannot be read: .*line 2: Bad configuration "
                       "option: nosuchkeyword") as info:
        ssh_config._resolve("lab", str(config), None, None, "h.yaml", "/usr/bin/ssh")
    assert info.value.hint == f"`ssh -G -F {config} lab` shows what OpenSSH makes of it"
    loop = tmp_path / "loop"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(InputError, match="Include nested more than 16 deep"):
        ssh_config.expanded_text([str(loop)])
