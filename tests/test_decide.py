"""``decide``: the one place that turns what was read from a host into apply's steps (the real run executes them,
the dry run prints them), in process and in milliseconds: unchanged, flags changed, a new overlay, a forced redo,
a pending switch, a missing or stale snapshot, and the flag diff of a managed command and of a systemd drop-in."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddtree_deploy.decide import Observed, decide, launch_drift, snapshot_step, wanted_launch
from ddtree_deploy.hoststate import ReleaseState
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.overlay import Overlay, OverlayFile

HOST = """\
name: gpu1
connection: local
python: /usr/bin/python3
site_packages: /opt/venv/lib/python3.11/site-packages
release_root: /opt/ddtree
probe:
  prompts: ["hello"]
server:
  kind: managed
  command: "{python} -m sglang.launch_server --model-path /m --port {port} {ddtree_flags}"
  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 16
  port: 30000
"""
OVERLAY = Overlay("sglang", "ddtree", "0.1.0", "0.5.11", "", (OverlayFile("sglang/version.py", b"x = 1\n"),))


@pytest.fixture()
def host(tmp_path: Path):
    path = tmp_path / "gpu1.yaml"
    path.write_text(HOST)
    return load_host_file(path)


def _deployed(host, digest: str = OVERLAY.digest, launch: str | None = None, **server) -> Observed:
    state = {"active": "r1", "previous_good": None, "pending": None, "bad": [],
             "releases": [{"id": "r1", "status": "good", "overlay_digest": digest}]}
    running = launch if launch is not None else wanted_launch(host)
    return Observed(ReleaseState.of(state), {"kind": "managed", "launch": running, "ddtree": True, "env": {}, **server},
                    True)


def test_deployed_host_with_the_same_overlay_and_flags_is_unchanged(host) -> None:
    d = decide(_deployed(host), OVERLAY, host)
    assert d.changed is False and d.summary.startswith("changed=0: release r1 already holds this overlay")
    assert [(s.action, s.data.get("unchanged")) for s in d.steps] == [("probe", True)]


def test_changed_flags_restart_the_same_release_and_show_the_diff(host) -> None:
    old = wanted_launch(host).replace("budget 16", "budget 8")
    d = decide(_deployed(host, launch=old), OVERLAY, host)
    assert d.changed is True and [s.action for s in d.steps] == ["check", "restart", "probe"]
    assert d.flag_diff == ("- --speculative-ddtree-budget 8", "+ --speculative-ddtree-budget 16")
    assert d.steps[1].data["release"] == "r1" and d.steps[2].data["rollback"] is False
    env = decide(_deployed(host, env={"CUDA_VISIBLE_DEVICES": "0"}), OVERLAY, host)
    assert env.flag_diff == ("- env CUDA_VISIBLE_DEVICES=0",)  # the environment is part of the launch


def test_an_unrecorded_launch_is_not_compared_and_says_so(host) -> None:
    obs = dataclasses.replace(_deployed(host), launch=None)
    d = decide(obs, OVERLAY, host)
    assert d.changed is False and "launch line was not recorded" in d.reason


def test_a_new_overlay_is_a_new_release_and_force_redoes_the_same(host) -> None:
    d = decide(_deployed(host, digest="other"), OVERLAY, host)
    assert d.changed is True and [s.action for s in d.steps] == ["push", "switch", "check", "restart", "probe"]
    assert "roll back to release r1" in d.steps[-1].text and d.steps[0].data["files"] == 1
    forced = decide(_deployed(host), OVERLAY, host, force=True)
    assert forced.changed is True and forced.reason.startswith("--force") and forced.steps[0].action == "push"


def test_first_deploy_records_a_baseline_and_settles_a_pending_switch(host) -> None:
    state = {"active": None, "previous_good": None, "bad": [], "releases": [],
             "pending": {"release": "r0", "run": "dead-run"}}
    observed = Observed(ReleaseState.of(state), None, False)
    d = decide(observed, OVERLAY, host)
    assert [s.action for s in d.steps] == ["settle", "baseline", "push", "switch", "check", "restart", "probe"]
    assert d.reason == "no overlay is active" and d.flag_diff == ()
    assert [s.action for s in decide(observed, OVERLAY, host, record_baseline=False).steps][1] == "push"


def test_snapshot_step_missing_stale_fresh() -> None:
    assert snapshot_step(None, None, 3600).data == {"why": "missing"}
    assert snapshot_step("s1", "2020-01-01T00:00:00Z", 3600).data["why"] == "stale"
    assert snapshot_step("s1", "2020-01-01T00:00:00Z", 3600, now=1577836800.0 + 10) is None


def test_systemd_drop_in_drift_is_by_line(host) -> None:
    unit = dataclasses.replace(host, server={**host.server, "kind": "systemd", "unit": "sglang.service"})
    old = wanted_launch(unit).replace("budget 16", "budget 32")
    drift = launch_drift(unit, {"kind": "systemd", "launch": old, "ddtree": True})
    assert drift and all(line.startswith(("- ", "+ ")) for line in drift)
    assert any("budget 32" in line for line in drift if line.startswith("- "))
    assert launch_drift(unit, {"kind": "systemd", "launch": wanted_launch(unit), "ddtree": True}) == ()
