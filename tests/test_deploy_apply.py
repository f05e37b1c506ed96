"""`ddtree-deploy apply` end to end on a sandbox host, through the real command line: the real DDTree patch set
applied to the host's own snapshot, the ABI verdict, the overlay pushed as a release, and the reference engine
(real DDTree decoding on CPU with the overlay's runtime) restarted on it and probed against a DDTree-off baseline."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.deploy import plan
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.transport import HostConnection
from standin.helpers import remove_root, write_host_yaml

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def e2e(sandbox, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apply")
    host = dataclasses.replace(sandbox.base, release_root="/srv/ddtree-host/t-apply",
                               probe=dict(sandbox.base.probe, startup_timeout=60.0))
    write_host_yaml(host, tmp / "hosts")
    env = {**os.environ, "DDTREE_INVENTORY": str(tmp / "hosts"), "DDTREE_SNAPSHOTS": str(tmp / "snapshots")}
    yield host, env
    remove_root(host)


def _cli(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ddtree_deploy", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _state(host):
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        return mgr.show(), mgr.installed_manifest()


def test_dry_run_shows_diff_and_abi_and_touches_nothing(e2e):
    host, env = e2e
    proc = _cli(env, "apply", "--host", host.name, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "+++ b/sglang/srt/speculative/ddtree/" in proc.stdout or "sglang/srt/speculative/ddtree/" in proc.stdout
    assert "ABI findings" in proc.stdout and "nothing was touched" in proc.stdout
    _untouched(host)


def _untouched(host):
    """No release, no switch, no lock (the snapshot may keep its hash cache in the release root)."""
    info, _ = _state(host)
    assert info["current"] is None and info["state"]["releases"] == [] and info["lock"] is None


def test_abi_errors_refuse_with_exit_4_unless_ignored_then_real_engine_passes(e2e, monkeypatch):
    host, env = e2e
    monkeypatch.setenv("DDTREE_SNAPSHOTS", env["DDTREE_SNAPSHOTS"])
    monkeypatch.chdir(REPO)
    p = plan(host)
    _, manifest = _state(host)
    if p.abi_errors:  # the sandbox's CPU torch is outside the patch set's torch range: refused, nothing touched
        proc = _cli(env, "apply", "--host", host.name)
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "ABI check failed; nothing was pushed" in proc.stderr
        _untouched(host)
    proc = _cli(env, "apply", "--host", host.name, "--ignore-abi", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["status"] == "ok" and report["details"]["patchset"] == p.overlay.patchset
    stages = {s["name"]: s for s in report["probe"]["stages"]}
    runtime_version = (REPO / "patches/ddtree/runtime/__init__.py").read_text().split('__version__ = "', 1)[1].split('"')[0]
    assert stages["overlay"]["data"]["runtime_version"] == runtime_version
    assert stages["startup"]["data"]["server_runtime_path"].startswith(f"{host.release_root}/releases/{report['release']}/sglang/")
    gen = stages["generation"]
    assert gen["status"] == "pass"  # DDTree on matches the DDTree-off greedy baseline token for token
    assert gen["data"]["spec_accept_length"] >= 1.0
    info, after = _state(host)
    assert info["state"]["active"] == report["release"] and after == manifest
    proc = _cli(env, "releases", host.name, "--json")
    rel = json.loads(proc.stdout)
    assert rel["state"]["releases"][-1]["status"] == "good" and rel["state"]["releases"][-1]["patchset"] == p.overlay.patchset


def test_cli_fleet_recap_and_retry_file(e2e, tmp_path, sandbox):
    """Canary (the base host) deploys; the 0.5.11 patch set does not apply to the drifted host's sglang 0.5.23:
    refused with exit 5, listed in the recap and written to the retry file; --retry-failed picks exactly it up."""
    host, env = e2e
    drift = dataclasses.replace(sandbox.drift, release_root="/srv/ddtree-host/t-apply-drift")
    write_host_yaml(drift, Path(env["DDTREE_INVENTORY"]))
    retry = tmp_path / "retry"
    try:
        pin = ["--patchset", "ddtree/sglang-0.5.11", "--ignore-abi", "--retry-file", str(retry)]
        proc = _cli(env, "apply", "--host", host.name, "--host", drift.name, *pin)
        assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "recap" in proc.stdout and "refused" in proc.stdout
        assert retry.read_text().split() == [drift.name]
        proc = _cli(env, "apply", "--retry-failed", *pin, "--json")
        doc = json.loads(proc.stdout)
        assert proc.returncode == 5 and [h["host"] for h in doc["hosts"]] == [drift.name]
        assert doc["hosts"][0]["status"] == "refused" and "0.5.23" in doc["hosts"][0]["message"]
        assert _state(drift)[0]["state"]["releases"] == []
    finally:
        remove_root(drift)
