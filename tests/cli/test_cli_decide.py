"""``apply --dry-run`` is the step list ``apply`` executes, and a change of server flags is a change (issue 25,
items 3 and 5), through the installed console script on a real sshd sandbox host served by the reference engine.

The host is the sandbox's base host under a name, release root and server port of its own. In file order: a dry
run on a host the local store has no snapshot of says "snapshot" and writes nothing anywhere (no store, nothing on
the host); the first apply deploys; a dry run and a real run on the deployed host agree that nothing changes
(``changed=0``, same server pid); then the host file's DDTree budget is edited: ``probe`` and ``releases`` warn that
the running server's flags differ, the dry run shows the flag diff and a restart, and ``apply`` restarts the same
release with the new budget and says which flag changed.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hostcopy import base_host_doc, host_doc

from ddtree_deploy.dryrun import numstat
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.server import ServerControl, base_url
from ddtree_deploy.transport import HostConnection

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
NAME = "decidebox"
FLAGS = "--speculative-algorithm DFLASH --speculative-ddtree-budget 16"


@pytest.fixture(scope="module")
def box(sandbox, wheel_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("decide")
    inv = root / "hosts"
    inv.mkdir()
    doc = base_host_doc(sandbox, NAME, "/srv/ddtree-host/decide-releases")
    doc["server"]["ddtree_flags"] = FLAGS
    host_file = inv / f"{NAME}.yaml"
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    store = root / "snapshots"
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(store)}

    def run(*args: str, timeout: float = 600):
        return wheel_env.run(*args, timeout=timeout, **env)

    yield run, host_file, store
    run("server", "stop", NAME, timeout=120)
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        conn.run(f"rm -rf {host.release_root}", check=False)


def _host_state(host_file: Path) -> tuple[dict, dict]:
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        return ReleaseManager(conn).show(), ServerControl(conn).status()


def _info(host_file: Path) -> dict:
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        reply = conn.call("probe", "server_info", url=base_url(host), timeout=30)
    return reply.get("info") or {} if reply.get("status") == 200 else {}


def _ok(proc) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_dry_run_without_a_snapshot_says_snapshot_and_writes_nothing_anywhere(box) -> None:
    """Issue 25.3: the dry run used to take the snapshot (34 MB into the local store) and then say "nothing was
    touched"."""
    run, host_file, store = box
    text = " ".join(_ok(run("apply", "--host", NAME, "--dry-run")).split())
    assert "1. [snapshot] take a snapshot of the installed sglang (the local store has none of this host)" in text
    assert "changed=?" in text and "nothing was touched" in text
    assert "ABI: no findings" not in text and "ABI findings" not in text  # nothing was checked: no snapshot
    assert not store.exists()  # not even an empty store directory
    info, server = _host_state(host_file)
    assert info["current"] is None and info["state"]["releases"] == [] and info["lock"] is None
    assert not server["running"]
    doc = json.loads(_ok(run("apply", "--host", NAME, "--dry-run", "--json")))
    steps = doc["details"]["summary"]["steps"]
    assert steps[0]["action"] == "snapshot" and doc["details"]["summary"]["changed"] is None
    assert not store.exists()


def test_first_apply_then_dry_run_and_real_run_agree_nothing_changes(box) -> None:
    """Issue 25.3: on a deployed host the dry run said "would change 41 files" and "would push 41 files" while the
    real run changed nothing; now both come from the same decision: changed=0."""
    run, host_file, store = box
    snap = _ok(run("snapshot", "take", NAME))
    assert store.is_dir(), snap
    dry = json.loads(_ok(run("apply", "--host", NAME, "--dry-run", "--json")))
    summary = dry["details"]["summary"]
    assert summary["changed"] is True and [s["action"] for s in summary["steps"]] == [
        "baseline", "push", "switch", "check", "restart", "probe"]
    assert summary["files"] and [f for f in summary["files"] if f["kind"] != "binary"] == numstat(dry["details"]["diff"])  # git apply --numstat's counts
    first = json.loads(_ok(run("apply", "--host", NAME, "--ignore-abi", "--json")))
    assert first["status"] == "ok" and [s["action"] for s in first["details"]["decision"]["steps"]] == [
        s["action"] for s in summary["steps"]]  # what the dry run said is what apply did
    pid = _host_state(host_file)[1]["pid"]
    again = run("apply", "--host", NAME, "--dry-run")
    text = " ".join(_ok(again).split())
    assert "changed=0" in text and "[probe] probe release" in text and "if it passes: nothing else" in text
    assert "[push]" not in text and "[restart]" not in text and "would push" not in text
    assert "the overlay against the installed package" not in text  # no file list when nothing would change
    real = json.loads(_ok(run("apply", "--host", NAME, "--ignore-abi", "--json")))
    assert real["status"] == "unchanged" and real["details"]["decision"]["changed"] is False
    assert _host_state(host_file)[1]["pid"] == pid  # neither run restarted the server


def test_edited_flags_are_warned_about_and_apply_restarts_showing_the_diff(box) -> None:
    """Issue 25.5: after the host file's budget changed, apply said "unchanged … no restart" and the server kept the
    old budget, with no word anywhere that the running flags differed from the file."""
    run, host_file, _ = box
    info, server = _host_state(host_file)
    release, pid = info["state"]["active"], server["pid"]
    assert _info(host_file)["speculative_ddtree_budget"] == 16
    original = host_file.read_text()
    host_file.write_text(original.replace("--speculative-ddtree-budget 16", "--speculative-ddtree-budget 8"))
    try:
        probe = run("probe", NAME)
        assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]
        warning = " ".join(probe.stderr.split())
        assert "the running server's flags differ from the host file" in warning
        assert "- --speculative-ddtree-budget 16; + --speculative-ddtree-budget 8" in warning
        probed = json.loads(_ok(run("probe", NAME, "--json")))
        assert probed["flag_drift"] == ["- --speculative-ddtree-budget 16", "+ --speculative-ddtree-budget 8"]
        releases = run("releases", NAME)
        assert releases.returncode == 0 and "flags differ from the host file" in " ".join(releases.stderr.split())
        dry = run("apply", "--host", NAME, "--dry-run")
        text = " ".join(_ok(dry).split())
        assert "changed=1" in text and "the server's flags differ from the host file" in text
        assert "- --speculative-ddtree-budget 16 + --speculative-ddtree-budget 8" in text
        assert "[restart] restart the server on release " + release in text and "[push]" not in text
        assert "the full diff" not in text and "the overlay against the installed package" not in text  # no push
        assert _host_state(host_file)[1]["pid"] == pid  # the dry run restarted nothing
        applied = run("apply", "--host", NAME, "--ignore-abi")
        out = " ".join(_ok(applied).split())
        assert f"release {release} restarted with the host file's flags and healthy" in out
        assert "- --speculative-ddtree-budget 16; + --speculative-ddtree-budget 8" in out
        info, server = _host_state(host_file)
        assert info["state"]["active"] == release and server["pid"] != pid  # the same release, restarted
        assert _info(host_file)["speculative_ddtree_budget"] == 8
        assert "flags differ" not in run("probe", NAME).stderr  # no drift left to warn about
        assert json.loads(_ok(run("apply", "--host", NAME, "--ignore-abi", "--json")))["status"] == "unchanged"
    finally:
        host_file.write_text(original)
    back = json.loads(_ok(run("apply", "--host", NAME, "--ignore-abi", "--json")))
    assert back["details"]["flag_diff"] == ["- --speculative-ddtree-budget 8", "+ --speculative-ddtree-budget 16"]
    assert _info(host_file)["speculative_ddtree_budget"] == 16


def test_numstat_counts_lines_that_look_like_headers() -> None:
    """The parser it replaced took a content line starting with "-- " or "++ " for a header: +1 -1 for a 2-line
    change; git's count is 2 2."""
    diff = ("diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,2 +1,2 @@\n"
            "--- old comment\n-+++ old\n+-- new comment\n+++ new\n")
    assert numstat(diff) == [{"path": "q.sql", "added": 2, "removed": 2, "kind": "changed"}]


def test_allow_base_drift_tries_the_nearest_series_instead_of_repeating_the_refusal(sandbox, wheel_env, tmp_path) -> None:
    """Issue 25.7: on sglang 0.5.23 (no series then), `apply --allow-base-drift` repeated the same error and the
    same hint (pass --allow-base-drift). Now it applies the nearest series despite the drift, loudly. The patch sets
    have a 0.5.23 series since; a copy without the series after 0.5.17 stands for a release newer than them all."""
    inv = tmp_path / "hosts"
    inv.mkdir()
    doc = host_doc(sandbox.drift.source, "driftbox", "/srv/ddtree-host/decide-drift")
    (inv / "driftbox.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches, ignore=lambda d, names: [
        n for n in names if re.fullmatch(r"sglang-0\.5\.(1[89]|2\d)", n) or n == "__pycache__"])
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(tmp_path / "snapshots"), "DDTREE_PATCHES": str(patches)}
    assert wheel_env.run("snapshot", "take", "driftbox", timeout=600, **env).returncode == 0
    refused = wheel_env.run("apply", "--host", "driftbox", "--dry-run", timeout=600, **env)
    assert refused.returncode == 5 and "has no series for sglang 0.5.23" in refused.stderr
    assert "--allow-base-drift" in refused.stderr  # the hint that names the way out
    tried = wheel_env.run("apply", "--host", "driftbox", "--dry-run", "--allow-base-drift", timeout=600, **env)
    said = " ".join((tried.stdout + tried.stderr).split())
    assert "has no series for sglang 0.5.23" not in said, said[-3000:]
    assert "despite base drift: its series is for 0.5.17" in said
    if tried.returncode == 0:  # the nearest series applies: the dry run lists the steps of a new release
        assert "changed=1" in said and "[push] build a new release" in said
    else:  # it does not: why, patch by patch, and no hint to pass the flag that was given
        assert tried.returncode == 5 and "pass --allow-base-drift" not in said, said[-3000:]
