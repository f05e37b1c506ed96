"""Probe stages on a sandbox host (stand-in server): each stage fails for its own reason with a clear message,
a baseline is recorded with DDTree off and compared token for token, and the command line gives a table or JSON
with per-stage timings and exit 0/1."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from ddtree_deploy.deploy import deploy_overlay, probe
from ddtree_deploy.overlay import OverlayFile
from ddtree_deploy.probe import Prober
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection
from standin.helpers import RUNTIME_INIT, install_standin, overlay, remove_root, standin_host, write_host_yaml

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def host(sandbox):
    h = standin_host(sandbox.base, "t-probe")
    install_standin(h)
    with HostConnection(h) as conn:  # a server on the installed package, as on a host before its first deploy
        ServerControl(conn).start(release=None, ddtree=False)
    yield h
    remove_root(h)


def test_record_baseline_then_probe_installed_package(host):
    result, baseline = probe(host, record=True)
    assert baseline["ddtree"] is False and baseline["release"] is None
    assert [o["prompt"] for o in baseline["outputs"]] == host.probe["prompts"]
    assert all(len(o["output_ids"]) == host.probe["max_new_tokens"] for o in baseline["outputs"])
    assert result.ok, result.to_dict()
    names = {s.name: s for s in result.stages}
    assert names["overlay"].detail.startswith("no overlay active: sglang from the installed package")
    assert names["selftest"].status == "skip"
    assert names["generation"].data["spec_accept_length"] == 1.0  # DDTree off on the installed package


def test_overlay_stage_refuses_release_without_or_with_broken_ddtree_package(host):
    """Caught before any restart: the old server keeps serving and is still the one running afterwards."""
    with HostConnection(host) as conn:
        pid_before = ServerControl(conn).status()["pid"]
    no_runtime = dataclasses.replace(overlay(), files=tuple(f for f in overlay().files if f.path != RUNTIME_INIT))
    report = deploy_overlay(host, no_runtime)
    assert report.status == "rolled-back"
    first = report.probe.stages[0]
    assert first.name == "overlay" and first.status == "fail" and "has no DDTree package" in first.detail
    assert [s.status for s in report.probe.stages[1:]] == ["not-run"] * 3
    broken = overlay(extra=(OverlayFile("sglang/srt/speculative/ddtree/__init__.py",
                                        b"import no_such_dependency_xyz\n__version__ = '1'\n", action="add"),))
    broken = dataclasses.replace(broken, files=tuple(f for f in broken.files if not (f.path == RUNTIME_INIT and b"no_such" not in f.content)))
    report = deploy_overlay(host, broken)
    first = report.probe.stages[0]
    assert first.status == "fail" and "loading the DDTree package from the release failed" in first.detail
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in first.log_tail
    with HostConnection(host) as conn:
        status = ServerControl(conn).status()
    assert status["pid"] == pid_before and status["running"]


def test_dead_server_fails_startup_at_once(host):
    with HostConnection(host) as conn:
        ServerControl(conn).stop()
        try:
            result = Prober(conn).run(None)
        finally:
            ServerControl(conn).start(release=None, ddtree=False)
    startup = next(s for s in result.stages if s.name == "startup")
    assert not result.ok and startup.status == "fail" and "is not running" in startup.detail
    assert startup.data["seconds"] < 1.0  # seen on the first poll, not at the 4 s deadline


def test_traceback_in_the_log_fails_startup_before_the_deadline(host):
    tb = dataclasses.replace(host, server=dict(host.server, env={"STANDIN_MODE": "traceback"}),
                             probe=dict(host.probe, startup_timeout=30.0))
    with HostConnection(tb) as conn:
        ctl = ServerControl(conn)
        try:
            ctl.restart(release=None, ddtree=False)
            stage = Prober(conn).startup(None)
        finally:
            ServerControl(conn).stop()
    with HostConnection(host) as conn:
        ServerControl(conn).start(release=None, ddtree=False)
    assert stage.status == "fail" and "a traceback appeared in the server log" in stage.detail
    assert "RuntimeError: standin: scripted worker crash" in stage.log_tail
    assert stage.data["seconds"] < 10.0  # the process still runs and /health says 503: the log decided, not the 30 s deadline


def test_changed_prompts_make_the_baseline_stale(host):
    changed = dataclasses.replace(host, probe=dict(host.probe, prompts=["a different prompt"]))
    with HostConnection(changed) as conn:
        result = Prober(conn).run(None)
    gen = result.stages[-1]
    assert gen.status == "fail" and "re-record it" in gen.detail


def test_cli_probe_json_and_table(host, tmp_path):
    inv = tmp_path / "hosts"
    write_host_yaml(host, inv)
    env = {**os.environ, "DDTREE_INVENTORY": str(inv)}
    proc = subprocess.run([sys.executable, "-m", "ddtree_deploy", "probe", host.name, "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and [s["name"] for s in doc["stages"]] == ["overlay", "selftest", "startup", "generation"]
    assert all(isinstance(s["seconds"], float) for s in doc["stages"])
    bad = dataclasses.replace(host, probe=dict(host.probe, prompts=["other"]))
    write_host_yaml(bad, inv)
    proc = subprocess.run([sys.executable, "-m", "ddtree_deploy", "probe", host.name], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "generation" in proc.stdout and "FAIL" in proc.stdout and "re-record" in proc.stdout


def test_kernel_selftest_runs_the_real_runtime_from_the_release(sandbox):
    """The self-test stage's remote path, with the DDTree runtime this repository vendors, loaded from a release by
    file path under the server's environment. The sandbox has no GPU, so the stage itself skips; here the same
    remote op is asked for device "cpu" to prove the plumbing and the runtime's own checks."""
    from pathlib import Path

    from ddtree_deploy.overlay import Overlay
    from ddtree_deploy.probe import RUNTIME_SUBDIR
    from ddtree_deploy.release import ReleaseManager

    runtime = Path(__file__).resolve().parent.parent / "patches" / "ddtree" / "runtime"
    files = tuple(OverlayFile(f"sglang/{RUNTIME_SUBDIR}/{p.name}", p.read_bytes(), action="add")
                  for p in sorted(runtime.glob("*.py")))
    ov = Overlay("sglang", "ddtree-runtime-only", "test", "0.5.11", "", files)
    h = standin_host(sandbox.base, "t-probe-selftest")
    try:
        with HostConnection(h) as conn:
            rel = ReleaseManager(conn).push(ov, switch=True)
            assert rel.switched["to"] == rel.release_id
            got = conn.call("probe", "selftest", root=h.release_root, env={}, runtime_subdir=RUNTIME_SUBDIR,
                            budget=120.0, device="cpu", timeout=180)
            staged = Prober(conn).run(rel.release_id)
        assert got["runtime_file"].startswith(f"{h.release_root}/releases/{rel.release_id}/sglang/")
        result = got["selftest"]
        assert result["ok"] is True and result["device"] == "cpu", result
        assert result["checks"] and all(result["checks"].values())
        stage = next(s for s in staged.stages if s.name == "selftest")
        assert stage.status == "skip" and "no GPU" in stage.detail
    finally:
        remove_root(h)
