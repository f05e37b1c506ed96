"""SSH as users have it (issue 16, item 3), against the real sshd sandbox hosts and through the installed CLI:
keys held only in ssh-agent work like OpenSSH, an ssh_alias typo names ssh_config, a dead ProxyJump bastion is
named as the bastion, and a port that is not SSH is one line, never paramiko's traceback."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hostfiles import write_host as _write_host

from ddtree_deploy.errors import TransportError
from ddtree_deploy.transport import HostConnection

pytestmark = pytest.mark.sandbox


@pytest.fixture()
def agent(tmp_path: Path, sandbox):
    """A real ssh-agent holding the sandbox client key; the key file itself is gone, so only the agent has it."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
        time.sleep(0.02)
    key = tmp_path / "only-in-agent"
    shutil.copy(sandbox.base.identity_file, key)
    key.chmod(0o600)
    env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
    subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, capture_output=True, timeout=30)
    key.unlink()
    listed = subprocess.run(["ssh-add", "-l"], env=env, capture_output=True, text=True, timeout=30)
    assert "ddtree-sandbox-client" in listed.stdout
    yield sock
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


def _no_key_host(sandbox, **changes):
    return dataclasses.replace(sandbox.base, identity_file=None, **changes)


def test_key_only_in_the_agent_connects_like_openssh(sandbox, agent, tmp_path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no ~/.ssh keys to fall back on: only the agent can authenticate
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent))
    host = _no_key_host(sandbox)
    ssh = subprocess.run(["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={host.known_hosts}",
                          "-p", str(host.port), f"root@{host.address}", "echo openssh"], capture_output=True, text=True,
                         timeout=60)
    assert ssh.returncode == 0 and ssh.stdout.strip() == "openssh", ssh.stderr
    with HostConnection(host) as conn:
        assert conn.run("echo ours").text().strip() == "ours"
    with pytest.raises(TransportError, match="authentication to .* failed") as info:
        HostConnection(dataclasses.replace(host, ssh_agent=False)).open()
    assert "ssh-agent (off" in str(info.value)


def test_agent_through_the_installed_cli(sandbox, agent, wheel_env, tmp_path) -> None:
    inv = tmp_path / "inv"
    _write_host(inv, sandbox.base, name="agent-only", identity_file=None)
    proc = wheel_env.run("hosts", "check", "--json", DDTREE_INVENTORY=str(inv), SSH_AUTH_SOCK=str(agent))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)[0]["sglang"] == "0.5.11"
    _write_host(inv, sandbox.base, name="agent-only", identity_file=None, ssh_agent=False)
    off = wheel_env.run("releases", "agent-only", DDTREE_INVENTORY=str(inv), SSH_AUTH_SOCK=str(agent))
    assert off.returncode == 3 and "authentication" in off.stderr and "Traceback" not in off.stderr


def _ssh_config(tmp_path: Path, sandbox, jump_port: int) -> Path:
    key = sandbox.base.identity_file
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {jump_port}\n  User root\n  IdentityFile {key}\n\n"
        f"Host behind\n  HostName 127.0.0.1\n  Port {sandbox.base.port}\n  User root\n  IdentityFile {key}\n  ProxyJump jumpbox\n"
    )
    return config


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ssh_alias_typo_names_ssh_config_and_its_entries(sandbox, wheel_env, tmp_path) -> None:
    config = _ssh_config(tmp_path, sandbox, sandbox.drift.port)
    inv = tmp_path / "inv"
    _write_host(inv, sandbox.base, name="typo", address=None, port=None, user=None, ssh_alias="behnd", ssh_config=str(config))
    proc = wheel_env.run("releases", "typo", DDTREE_INVENTORY=str(inv))
    assert proc.returncode == 3, proc.stderr
    assert "cannot resolve behnd" in proc.stderr
    assert f"'behnd' is not a Host entry of {config}" in proc.stderr and "behind, jumpbox" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 2


def test_unreachable_bastion_is_named_as_the_bastion(sandbox, wheel_env, tmp_path) -> None:
    dead = _closed_port()
    config = _ssh_config(tmp_path, sandbox, dead)
    inv = tmp_path / "inv"
    _write_host(inv, sandbox.base, name="behind", address=None, port=None, user=None, ssh_alias="behind", ssh_config=str(config))
    proc = wheel_env.run("releases", "behind", DDTREE_INVENTORY=str(inv))
    assert proc.returncode == 3, proc.stderr
    assert f"cannot connect to ProxyJump bastion jumpbox (127.0.0.1:{dead})" in proc.stderr
    assert f"127.0.0.1:{sandbox.base.port}" not in proc.stderr  # the target was never the problem
    assert "Traceback" not in proc.stderr
    # and with a live bastion the same host file works
    config.write_text(config.read_text().replace(f"Port {dead}", f"Port {sandbox.drift.port}"))
    ok = wheel_env.run("hosts", "check", "behind", DDTREE_INVENTORY=str(inv))
    assert ok.returncode == 0, ok.stdout + ok.stderr


class _Http(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_port_that_is_not_ssh_is_one_line(sandbox, wheel_env, tmp_path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        inv = tmp_path / "inv"
        _write_host(inv, sandbox.base, name="web", port=server.server_address[1], connect_timeout=3.0)
        proc = wheel_env.run("releases", "web", DDTREE_INVENTORY=str(inv))
    finally:
        server.shutdown()
        thread.join()
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: host web: 127.0.0.1:"), proc.stderr
    assert "does not speak SSH" in lines[0] or "no SSH handshake" in lines[0]
    assert "field 'port'" in lines[1]
    assert "Traceback" not in proc.stderr and "paramiko" not in proc.stderr and "Exception (client)" not in proc.stderr


def _included_config(tmp_path: Path, sandbox) -> Path:
    """An ssh_config whose only Host entry comes from a file it Includes (as ~/.ssh/config.d/ setups do)."""
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "lab.conf").write_text(
        f"Host lab-gpu\n  HostName 127.0.0.1\n  Port {sandbox.base.port}\n  User root\n"
        f"  IdentityFile {sandbox.base.identity_file}\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Include {tmp_path}/conf.d/*.conf\n")
    return config


def test_an_alias_defined_through_include_resolves_like_ssh_G(sandbox, wheel_env, tmp_path) -> None:
    config = _included_config(tmp_path, sandbox)
    inv = tmp_path / "inv"
    _write_host(inv, sandbox.base, name="lab", address=None, port=None, user=None, identity_file=None,
                ssh_alias="lab-gpu", ssh_config=str(config))
    openssh = subprocess.run(["ssh", "-G", "-F", str(config), "lab-gpu"], capture_output=True, text=True, timeout=30)
    assert f"port {sandbox.base.port}" in openssh.stdout.splitlines()  # what OpenSSH itself makes of it
    listed = wheel_env.run("hosts", "list", "--json", DDTREE_INVENTORY=str(inv))
    row = json.loads(listed.stdout)[0]
    assert listed.returncode == 0 and row["ssh_config_by"] == "ssh -G", listed.stdout + listed.stderr
    assert (row["hostname"], row["port"], row["user"]) == ("127.0.0.1", sandbox.base.port, "root")
    table = wheel_env.run("hosts", "list", DDTREE_INVENTORY=str(inv))
    line = next(ln for ln in table.stdout.splitlines() if " lab " in ln)
    assert str(sandbox.base.port) in line and " 22 " not in line, table.stdout  # the real port, not 22
    check = wheel_env.run("hosts", "check", "lab", "--json", DDTREE_INVENTORY=str(inv))
    assert check.returncode == 0 and json.loads(check.stdout)[0]["sglang"] == "0.5.11", check.stdout + check.stderr


def test_without_the_openssh_client_paramiko_reads_the_includes(sandbox, wheel_env, tmp_path) -> None:
    config = _included_config(tmp_path, sandbox)
    inv = tmp_path / "inv"
    _write_host(inv, sandbox.base, name="lab", address=None, port=None, user=None, identity_file=None,
                ssh_alias="lab-gpu", ssh_config=str(config))
    no_ssh = str(wheel_env.venv / "bin")  # a PATH with no ssh on it
    assert shutil.which("ssh", path=no_ssh) is None
    listed = wheel_env.run("hosts", "list", "--json", DDTREE_INVENTORY=str(inv), PATH=no_ssh)
    row = json.loads(listed.stdout)[0]
    assert row["ssh_config_by"] == "paramiko", listed.stdout + listed.stderr
    assert (row["hostname"], row["port"], row["user"]) == ("127.0.0.1", sandbox.base.port, "root")
    check = wheel_env.run("hosts", "check", "lab", "--json", DDTREE_INVENTORY=str(inv), PATH=no_ssh)
    assert check.returncode == 0 and json.loads(check.stdout)[0]["sglang"] == "0.5.11", check.stdout + check.stderr
    # and a typo'd alias still gets the clear error, naming the entries Include brought in
    _write_host(inv, sandbox.base, name="lab", address=None, port=None, user=None, ssh_alias="lab-gup",
                ssh_config=str(config))
    for path in (no_ssh, os.environ["PATH"]):
        typo = wheel_env.run("releases", "lab", DDTREE_INVENTORY=str(inv), PATH=path)
        assert typo.returncode == 3 and "'lab-gup' is not a Host entry" in typo.stderr, typo.stderr
        assert "(entries there: lab-gpu)" in typo.stderr and "Traceback" not in typo.stderr
