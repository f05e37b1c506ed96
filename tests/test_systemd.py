"""systemd hosts on a sandbox host, with a small stand-in for systemctl/journalctl/sudo (standin/fake_systemd.py:
the sandbox runs no systemd): the drop-in and every systemctl/journalctl call go through the host file's `become`;
the drop-in carries the DDTree flags (on for a release, off for the baseline); a deploy runs the whole flow through
the unit; a become that is refused is one clear line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ddtree_deploy.deploy import deploy_overlay
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.transport import HostConnection
from standin.helpers import install_fake_systemd, install_standin, overlay, remove_root, run_cli, standin_host, write_host_yaml

pytestmark = pytest.mark.sandbox
UNIT = "ddtree-test.service"
FLAGS = "--speculative-algorithm DDTREE --ddtree-budget 16"


@pytest.fixture(scope="module")
def unit_host(sandbox, tmp_path_factory):
    base = standin_host(sandbox.base, "t-systemd")
    install_standin(base)
    fake = install_fake_systemd(base, "t-systemd-fake")
    server = {"kind": "systemd", "unit": UNIT, "unit_dir": f"{fake}/units", "become": f"{fake}/bin/sudo",
              "command": base.server["command"], "ddtree_flags": FLAGS, "port": base.server["port"], "stop_timeout": 5.0}
    inv = tmp_path_factory.mktemp("systemd") / "hosts"
    host = load_host_file(write_host_yaml(dataclasses.replace(base, server=server), inv))
    yield host, inv, fake
    with HostConnection(host) as conn:
        conn.run(f"{fake}/bin/sudo systemctl stop {UNIT}", check=False)
        conn.run(f"rm -rf {fake}")
    remove_root(dataclasses.replace(host, server=dict(base.server)))


def _sudo_log(host, fake):
    with HostConnection(host) as conn:
        return [json.loads(ln) for ln in conn.run(f"cat {fake}/sudo.log", check=False).text().splitlines() if ln]


def test_deploy_through_a_unit_with_become_and_flags_in_the_dropin(unit_host):
    host, inv, fake = unit_host
    report = deploy_overlay(host, overlay())
    assert report.status == "ok", report.message + str(report.probe.to_dict() if report.probe else "")
    calls = _sudo_log(host, fake)
    assert ["systemctl", "daemon-reload"] in calls and ["systemctl", "restart", UNIT] in calls
    assert any(c[:2] == ["sh", "-c"] and c[-1].endswith(f"{UNIT}.d/50-ddtree.conf") for c in calls)  # the write, too
    assert any(c[:2] == ["systemctl", "show"] for c in calls)
    with HostConnection(host) as conn:
        dropin = conn.run(f"cat {fake}/units/{UNIT}.d/50-ddtree.conf").text()
        log = conn.run(f"cat {fake}/{UNIT}.log").text()
    assert f'Environment="DDTREE_FLAGS={FLAGS}"' in dropin and dropin.rstrip().endswith(FLAGS)
    assert f'Environment="PYTHONPATH={host.release_root}/current"' in dropin
    # the baseline was recorded with DDTree off (the drop-in without the flags), then the release ran with them
    assert "speculative False" in log and "speculative True" in log
    assert log.index("speculative False") < log.rindex("speculative True")
    status = run_cli(inv, "server", "status", host.name, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["running"]
    # the unit's log is the journal, read through `become` too (asked for here: whether the probe read it while
    # waiting for start-up depends on how fast the server answered)
    logs = run_cli(inv, "server", "logs", host.name, "--lines", "50")
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert any(c[0] == "journalctl" and UNIT in c for c in _sudo_log(host, fake))


def test_record_baseline_with_ddtree_off_through_the_unit(unit_host):
    host, inv, fake = unit_host
    with HostConnection(host) as conn:  # a release must be active for "back to the flags" (tests may run in any order)
        active = ReleaseManager(conn).show()["state"]["active"]
    if active is None:
        assert deploy_overlay(host, overlay()).status == "ok"
    proc = run_cli(inv, "probe", host.name, "--record-baseline")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"baseline recorded on {host.name}" in proc.stdout and "DDTree off" in proc.stdout
    with HostConnection(host) as conn:
        dropin = conn.run(f"cat {fake}/units/{UNIT}.d/50-ddtree.conf").text()
    assert dropin.rstrip().endswith(FLAGS)  # back to the flags once the baseline is recorded


def test_a_refused_become_is_one_clear_line(unit_host):
    host, inv, fake = unit_host
    with HostConnection(host) as conn:
        conn.run(f"touch {fake}/sudo-refuse")
        try:
            proc = run_cli(inv, "server", "restart", host.name)
        finally:
            conn.run(f"rm -f {fake}/sudo-refuse")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "was refused: sudo: a password is required" in " ".join(proc.stderr.split())
    assert "server.become" in proc.stderr
