"""The hand-driven write commands through the real command line on a sandbox host (stand-in server): rollback to a
bad release needs --force; every write command has a dry run that changes nothing; a server on the port that the
tool did not start is named by probe, status and start; the start-up no-progress rule fails a wedged start early
and leaves a slow start that keeps logging alone."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from ddtree_deploy.probe import Prober
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection
from standin.helpers import STANDIN_PATH, deployed_standin, install_standin, remove_root, run_cli, standin_host, write_host_yaml

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def two(sandbox, tmp_path_factory):
    """A host copy with a good release, then a second release that failed its probe (marked bad)."""
    inv = tmp_path_factory.mktemp("hostops") / "hosts"
    host, (good, bad) = deployed_standin(sandbox.base, "t-hostops", inv, None, "crash")
    assert good.status == "ok" and bad.status == "rolled-back"
    yield host, inv, good.release, bad.release
    remove_root(host)


def _snapshot(host):
    with HostConnection(host) as conn:
        info = ReleaseManager(conn).show(journal_lines=5)
        return info["state"], info["current"], ServerControl(conn).status()["pid"], info["journal"]


def test_rollback_to_a_bad_release_is_refused_unless_forced(two):
    host, inv, good, bad = two
    before = _snapshot(host)
    proc = run_cli(inv, "rollback", host.name, "--to", bad)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"release {bad} is marked bad" in " ".join(proc.stderr.split()) and "--force" in proc.stderr
    assert _snapshot(host)[:3] == before[:3]
    forced = run_cli(inv, "rollback", host.name, "--to", bad, "--force", "--json")
    doc = json.loads(forced.stdout)
    assert doc["rolled_back_to"] == bad and doc["status"] == "rollback-failed" and forced.returncode == 1  # it is bad
    back = run_cli(inv, "rollback", host.name, "--to", good, "--force")
    assert back.returncode == 0, back.stdout + back.stderr
    assert _snapshot(host)[0]["active"] == good


@pytest.mark.parametrize("args, words", [
    (["rollback", "{host}", "--dry-run"], ["switch current from {good} to the installed package", "mark {good} bad",
                                           "restart `", "probe it"]),
    (["server", "stop", "{host}", "--dry-run"], ["would stop the managed server (SIGTERM, SIGKILL after 5.0 s)"]),
    (["server", "restart", "{host}", "--dry-run"], ["would restart `", "on release {good} (DDTree on)"]),
    (["server", "start", "{host}", "--dry-run"], ["would start `"]),
    (["probe", "{host}", "--record-baseline", "--dry-run"], ["(DDTree off)", "write /srv/ddtree-host/t-hostops/probe-baseline.json",
                                                             "(DDTree on)"]),
])
def test_every_write_command_has_a_dry_run_that_changes_nothing(two, args, words):
    host, inv, good, _ = two
    fill = {"host": host.name, "good": good}
    before = _snapshot(host)
    proc = run_cli(inv, *[a.format(**fill) for a in args])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())
    for w in words:
        assert w.format(**fill) in text, (w, text)
    assert "nothing was touched" in text
    assert _snapshot(host) == before  # same state, link, server pid and journal


def test_a_server_the_tool_did_not_start_is_named(sandbox, tmp_path):
    from ddtree_deploy.sandbox import _free_port

    host = standin_host(sandbox.base, "t-hostops-foreign")
    host = dataclasses.replace(host, server=dict(host.server, port=_free_port(exclude={host.server["port"]})))
    install_standin(host)
    inv = tmp_path / "hosts"
    write_host_yaml(host, inv)
    port = host.server["port"]
    with HostConnection(host) as conn:
        pid = conn.run(f"setsid {host.python} {STANDIN_PATH} --port {port} > /dev/null 2>&1 < /dev/null & echo $!").text().strip()
        try:
            for _ in range(100):
                if conn.run(f"{host.python} -c \"import urllib.request as u;u.urlopen('http://127.0.0.1:{port}/health')\"",
                            check=False).ok:
                    break
                time.sleep(0.05)
            probe = run_cli(inv, "probe", host.name)
            text = " ".join(probe.stdout.split())
            assert probe.returncode == 1 and "a server the tool did not start" in text and f"pid {pid}" in text
            assert "pid None" not in text
            start = run_cli(inv, "server", "start", host.name)
            assert start.returncode == 1, start.stdout + start.stderr
            err = " ".join(start.stderr.split())
            assert f"port {port} is already in use by pid {pid}" in err and "did not start" in err
            status = run_cli(inv, "server", "status", host.name)
            assert status.returncode == 1 and f"pid {pid}" in " ".join(status.stderr.split())
        finally:
            conn.run(f"kill {pid}", check=False)
    remove_root(host)


def test_no_progress_rule_fails_a_wedged_start_but_not_a_slow_one_that_logs(sandbox):
    host = standin_host(sandbox.base, "t-hostops-stall", probe={"startup_timeout": 30.0, "startup_stall_timeout": 1.5})
    install_standin(host)
    try:
        with HostConnection(host) as conn:
            wedged = dataclasses.replace(host, server=dict(host.server, env={"STANDIN_MODE": "wedge"}))
            with HostConnection(wedged) as c:
                ServerControl(c).restart(release=None, ddtree=False)
                stage = Prober(c).startup(None)
            assert stage.status == "fail" and "start-up made no progress" in stage.detail
            assert stage.seconds < 6.0  # 1.5 s of silence, not the 30 s budget
            slow = dataclasses.replace(host, server=dict(host.server, env={"STANDIN_MODE": "slowload"},
                                                         command=host.server["command"] + " --load-seconds 4"))
            with HostConnection(slow) as c:
                ServerControl(c).restart(release=None, ddtree=False)
                stage = Prober(c).startup(None)
            assert stage.status == "pass", stage.detail  # 4 s of loading, logging all the way, under a 1.5 s stall rule
            assert stage.data["seconds"] > 3.5
            ServerControl(conn).stop()
    finally:
        remove_root(host)
