"""Server control: the launch command and the systemd drop-in as the host file says, and the managed lifecycle
(setsid, pid file with start time, PYTHONPATH=<root>/current, log rotation) on a sandbox host."""

from __future__ import annotations

import dataclasses
import time

import pytest

from ddtree_deploy.errors import InputError
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.server import ServerControl, launch_command, render_dropin, require_server
from ddtree_deploy.transport import HostConnection
from standin.helpers import install_standin, remove_root, standin_host


def _host(tmp_path, server: dict) -> object:
    import yaml

    path = tmp_path / "gpu1.yaml"
    path.write_text(yaml.safe_dump({"address": "10.0.0.1", "python": "/opt/venv/bin/python",
                                    "site_packages": "/opt/venv/lib/python3.12/site-packages",
                                    "release_root": "/opt/ddtree", "server": server}))
    return load_host_file(path)


def test_launch_command_fills_placeholders_and_drops_ddtree_flags_on_request(tmp_path):
    host = _host(tmp_path, {"kind": "managed", "port": 31000, "ddtree_flags": "--speculative-algorithm DDTREE",
                            "command": "{python} -m sglang.launch_server --host {host} --port {port} {ddtree_flags}"})
    assert launch_command(host) == ("/opt/venv/bin/python -m sglang.launch_server --host 127.0.0.1 --port 31000 "
                                    "--speculative-algorithm DDTREE")
    assert launch_command(host, ddtree=False).endswith("--port 31000")


def test_bad_server_sections_name_file_and_field(tmp_path):
    bad = _host(tmp_path, {"kind": "managed", "command": "{python} --port {prot}"})
    with pytest.raises(InputError, match=r"gpu1.yaml: field 'server.command': bad placeholder 'prot'"):
        launch_command(bad)
    with pytest.raises(InputError, match=r"gpu1.yaml: field 'server.unit' is empty"):
        require_server(_host(tmp_path, {"kind": "systemd"}))
    with pytest.raises(InputError, match=r"field 'server.kind' is 'none'"):
        require_server(_host(tmp_path, {}))


def test_systemd_dropin_sets_pythonpath_and_quotes_environment(tmp_path):
    host = _host(tmp_path, {"kind": "systemd", "unit": "sglang.service",
                            "env": {"CUDA_VISIBLE_DEVICES": "0,1", "NOTE": 'say "hi" \\ bye'}})
    text = render_dropin(host)
    lines = text.splitlines()
    assert lines[2] == "[Service]"
    assert lines[3:] == ['Environment="PYTHONPATH=/opt/ddtree/current"',
                         'Environment="CUDA_VISIBLE_DEVICES=0,1"',
                         'Environment="NOTE=say \\"hi\\" \\\\ bye"',
                         'Environment="DDTREE_FLAGS="']


def test_become_is_validated_and_run_without_a_prompt(tmp_path):
    from ddtree_deploy.server import become_prefix

    with pytest.raises(InputError, match=r"gpu1.yaml: field 'server.become': expected sudo, doas or an absolute command"):
        _host(tmp_path, {"kind": "systemd", "unit": "sglang.service", "become": "su"})
    assert become_prefix(_host(tmp_path, {"kind": "systemd", "unit": "u", "become": "sudo"})) == "sudo -n"
    assert become_prefix(_host(tmp_path, {"kind": "systemd", "unit": "u", "become": "/usr/bin/doas -u svc"})) == "/usr/bin/doas -u svc"


def test_systemd_dropin_carries_ddtree_flags_on_and_off(tmp_path):
    """The host file's DDTree flags reach the unit: as DDTREE_FLAGS always, and in an ExecStart that replaces the
    unit's own when the host file gives the command; with DDTree off (a baseline) both lose the flags."""
    host = _host(tmp_path, {"kind": "systemd", "unit": "sglang.service", "port": 31000,
                            "ddtree_flags": "--speculative-algorithm DFLASH --speculative-ddtree-budget 64",
                            "command": "{python} -m sglang.launch_server --port {port} {ddtree_flags}"})
    on = render_dropin(host).splitlines()
    assert 'Environment="DDTREE_FLAGS=--speculative-algorithm DFLASH --speculative-ddtree-budget 64"' in on
    assert on[-2:] == ["ExecStart=", "ExecStart=/opt/venv/bin/python -m sglang.launch_server --port 31000 "
                       "--speculative-algorithm DFLASH --speculative-ddtree-budget 64"]
    off = render_dropin(host, ddtree=False).splitlines()
    assert 'Environment="DDTREE_FLAGS="' in off
    assert off[-1] == "ExecStart=/opt/venv/bin/python -m sglang.launch_server --port 31000"


@pytest.mark.sandbox
def test_systemd_dropin_written_atomically_and_only_when_changed(sandbox):
    host = dataclasses.replace(standin_host(sandbox.base, "t-srv-systemd"),
                               server={"kind": "systemd", "unit": "sglang.service", "env": {"A": "1"}})
    unit_dir = "/srv/ddtree-host/t-srv-systemd/units"
    try:
        with HostConnection(host) as conn:
            ctl = ServerControl(conn)
            first = ctl.install_dropin(unit_dir=unit_dir, reload=False)
            assert first == {"path": f"{unit_dir}/sglang.service.d/50-ddtree.conf", "changed": True}
            assert conn.run(f"cat {first['path']}").text() == render_dropin(host)
            assert ctl.install_dropin(unit_dir=unit_dir, reload=False)["changed"] is False
    finally:
        remove_root(dataclasses.replace(host, server=dict(sandbox.base.server)))


def _eventually(read, needle: str, timeout: float = 30.0) -> str:
    """``read()`` until it holds ``needle`` or ``timeout`` passes; the last text either way. A server started or
    restarted is running when the command returns, but what it prints comes when it gets there (seconds on a
    loaded machine), so a log is waited for, not read at once."""
    deadline = time.monotonic() + timeout
    text = read()
    while needle not in text and time.monotonic() < deadline:
        time.sleep(0.2)
        text = read()
    return text


@pytest.mark.sandbox
def test_managed_server_lifecycle(sandbox):
    host = standin_host(sandbox.base, "t-srv-managed")
    install_standin(host)
    try:
        with HostConnection(host) as conn:
            ctl = ServerControl(conn)
            assert ctl.status()["running"] is False
            started = ctl.start(release="r1", ddtree=True)
            st = ctl.status()
            assert st["running"] and st["pid"] == started["pid"] and st["release"] == "r1"
            # its own session, and the release root's `current` first on its import path
            sid = conn.run(f"ps -o sid= -p {started['pid']}").text().strip()
            assert sid == str(started["pid"])
            environ = conn.run(f"tr '\\0' '\\n' < /proc/{started['pid']}/environ").text().splitlines()
            assert f"PYTHONPATH={host.release_root}/current" in environ
            with pytest.raises(Exception, match="already running"):
                ctl.start(release="r1")
            again = ctl.restart(release="r2", ddtree=False)
            assert again["stopped"]["was_running"] and again["stopped"]["signal"] == "TERM"
            assert ctl.status()["release"] == "r2"
            assert "speculative False" in _eventually(lambda: ctl.logs(20)["text"], "speculative False")
            assert "speculative True" in ctl.logs(20, previous=True)["text"]  # the log of the run before
            stopped = ctl.stop()
            assert stopped["was_running"] and not ctl.status()["running"]
            state = conn.run(f"ps -o stat= -p {again['started']['pid']}", check=False).text().strip()
            assert state in ("",) or state.startswith("Z")  # gone (or a zombie waiting for init to reap it)
            assert ctl.stop() == {"was_running": False}
    finally:
        remove_root(host)


@pytest.mark.sandbox
def test_server_commands(sandbox, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from standin.helpers import write_host_yaml

    host = standin_host(sandbox.base, "t-srv-cli")
    install_standin(host)
    write_host_yaml(host, tmp_path / "hosts")
    env = {**os.environ, "DDTREE_INVENTORY": str(tmp_path / "hosts"), "COLUMNS": "200"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ddtree_deploy", "server", *args, host.name], env=env,
                              capture_output=True, text=True, timeout=120)

    try:
        assert cli("status").returncode == 1  # not running: a script can tell
        assert cli("start").returncode == 0
        status = json.loads(cli("status", "--json").stdout)
        assert status["running"] and status["active_release"] is None and status["release"] is None
        def logs() -> str:
            proc = cli("logs")
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

        assert "speculative False" in _eventually(logs, "speculative False")  # no overlay active: DDTree flags off
        assert cli("restart").returncode == 0
        assert json.loads(cli("status", "--json").stdout)["pid"] != status["pid"]
        assert cli("stop").returncode == 0
        assert json.loads(cli("status", "--json").stdout)["running"] is False
    finally:
        remove_root(host)
