"""deploy_overlay end to end on a sandbox host whose server is the stand-in: a good release passes; a release that
crashes, hangs or answers wrongly fails the probe at the right stage and is rolled back; a first overlay that fails
goes back to the installed package; a second concurrent apply is refused; a hand rollback works."""

from __future__ import annotations

import threading

import pytest

from ddtree_deploy.deploy import ApplyReport, deploy_overlay, rollback
from ddtree_deploy.release import LockHeld, ReleaseManager
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection
from standin.helpers import install_standin, overlay, remove_root, standin_host

pytestmark = pytest.mark.sandbox


def _stage(report_probe, name):
    return next(s for s in report_probe.stages if s.name == name)


def _state(host):
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        return mgr.show(journal_lines=20), mgr.installed_manifest(), ServerControl(conn).status()


@pytest.fixture(scope="module")
def deployed(sandbox):
    """A host copy with one good release deployed (and the baseline recorded with DDTree off on the way)."""
    host = standin_host(sandbox.base, "t-deploy")
    install_standin(host)
    with HostConnection(host) as conn:
        manifest = ReleaseManager(conn).installed_manifest()
    report = deploy_overlay(host, overlay())
    yield host, report, manifest
    remove_root(host)


def test_good_overlay_passes_every_stage(deployed):
    host, report, manifest = deployed
    assert report.status == "ok" and report.exit_code == 0, report.message
    assert [(s.name, s.status) for s in report.probe.stages] == [
        ("overlay", "pass"), ("selftest", "skip"), ("startup", "pass"), ("generation", "pass")]
    assert "no GPU" in _stage(report.probe, "selftest").detail
    assert _stage(report.probe, "overlay").data["runtime_version"] == "0.1.0-test"
    gen = _stage(report.probe, "generation")
    assert gen.data["spec_accept_length"] == 3.25 and gen.data["prompts"] == len(host.probe["prompts"])
    info, now, server = _state(host)
    assert info["state"]["active"] == report.release and info["current"] == f"releases/{report.release}"
    assert info["state"]["releases"][-1]["status"] == "good"
    assert server["running"] and server["release"] == report.release
    assert now == manifest
    events = [e["event"] for e in info["journal"]]
    assert events[-3:] == ["switch", "mark", "apply"] and "push" in events
    assert "baseline" in report.timings  # the first deploy recorded the generation baseline (DDTree off)


@pytest.mark.parametrize("mode, stage, reason", [
    ("crash", "startup", "is not running"),
    ("hang", "startup", "did not answer 200 within the start-up budget of 4 s"),
    ("wrong-output", "generation", "output differs from the baseline at token"),
])
def test_failing_release_is_rolled_back(deployed, mode, stage, reason):
    host, good, manifest = deployed
    report = deploy_overlay(host, overlay(mode))
    assert report.status == "rolled-back" and report.exit_code == 1, report.message
    failed = _stage(report.probe, stage)
    assert failed.status == "fail" and reason in failed.detail
    assert failed.log_tail  # the failure is shown with the server log
    if mode == "crash":
        assert "standin: scripted start-up crash" in failed.log_tail
        # a dead server fails the probe when it is seen dead, not at the start-up deadline (4 s; the bound is that
        # deadline, not a speed: a loaded 2-core machine may take a second or two to notice)
        assert failed.seconds < 4.0 and "within the start-up budget" not in failed.detail
    assert report.rolled_back_to == good.release
    assert report.rollback_probe is not None and report.rollback_probe.ok
    info, now, server = _state(host)
    st = info["state"]
    assert st["active"] == good.release and info["current"] == f"releases/{good.release}"
    assert report.release in st["bad"]
    assert next(r for r in st["releases"] if r["id"] == report.release)["status"] == "bad"
    assert server["running"] and server["release"] == good.release
    assert now == manifest
    assert info["journal"][-1]["event"] == "apply" and info["journal"][-1]["outcome"] == "rolled-back"


def test_concurrent_apply_is_refused(deployed):
    host, good, _ = deployed
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            results[name] = deploy_overlay(host, overlay(version=f"0.2.0-{name}"), command=f"apply {name}")
        except LockHeld as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [v for v in results.values() if isinstance(v, LockHeld)]
    done = [v for v in results.values() if isinstance(v, ApplyReport)]
    assert len(refused) == 1 and len(done) == 1, results
    assert "another deploy is in progress" in str(refused[0]) and "apply " in str(refused[0])
    assert done[0].status == "ok"
    info, _, _ = _state(host)
    assert info["lock"] is None and info["state"]["active"] == done[0].release
    # by hand: back to the previous good release, the one we leave is marked bad
    back = rollback(host)
    assert back.status == "ok" and back.rolled_back_to == good.release and back.probe.ok
    info, _, _ = _state(host)
    assert info["state"]["active"] == good.release and done[0].release in info["state"]["bad"]


def test_first_overlay_failing_goes_back_to_installed_package(sandbox):
    host = standin_host(sandbox.drift, "t-deploy-first")
    install_standin(host)
    try:
        report = deploy_overlay(host, overlay("exit", base_version="0.5.23"))
        assert report.status == "rolled-back", report.message
        assert report.rolled_back_to is None
        assert "is not running" in _stage(report.probe, "startup").detail
        again = report.rollback_probe
        assert again.ok and again.release is None
        assert "no overlay active" in _stage(again, "overlay").detail
        assert _stage(again, "selftest").status == "skip"
        info, _, server = _state(host)
        assert info["state"]["active"] is None and info["current"] == "base"
        assert server["running"] and server["release"] is None
    finally:
        remove_root(host)


def test_cli_releases_and_rollback_to_installed(deployed, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from standin.helpers import write_host_yaml

    host, good, _ = deployed
    write_host_yaml(host, tmp_path / "hosts")
    env = {**os.environ, "DDTREE_INVENTORY": str(tmp_path / "hosts"), "COLUMNS": "250"}
    cli = [sys.executable, "-m", "ddtree_deploy"]
    proc = subprocess.run(cli + ["releases", host.name], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and good.release in proc.stdout and "active" in proc.stdout
    proc = subprocess.run(cli + ["rollback", host.name, "--to", "no-such-release"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no release 'no-such-release'" in proc.stderr
    proc = subprocess.run(cli + ["rollback", host.name, "--to", "installed", "--json"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["rolled_back_to"] is None and doc["probe"]["ok"]
    info = json.loads(subprocess.run(cli + ["releases", host.name, "--json"], env=env, capture_output=True, text=True,
                                     timeout=120).stdout)
    assert info["state"]["active"] is None and info["current"] == "base"
    assert info["journal"][-1]["event"] == "rollback"
