"""The ddtree.deploy collection (#31) on sandbox hosts with real ansible-core: built by ``ansible-galaxy collection
build`` from this package, installed with ``ansible-galaxy collection install``, run by ansible-runner over five
stand-in copies of a sandbox host (each its own release root and server), one of which gets an overlay its server
crashes on.

One scenario, in order: a play with ``serial: [1, "50%"]`` (the crashing host rolled back, the rest probed-good,
the batches in order), a second run that changes nothing, ``--check --diff`` that writes nothing anywhere, and a
controller killed during a probe, after which the host's guardian has rolled the run back."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddtree_deploy.ansible import collection
from ddtree_deploy.ansible.bundle import write_bundle
from ddtree_deploy.ansible.hostvars import inventory_doc
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection
from standin.helpers import install_standin, overlay, remove_root, standin_host

ansible_runner = pytest.importorskip("ansible_runner")
pytestmark = pytest.mark.sandbox
BIN = Path(sys.executable).parent
NAMES = [f"ans{i}" for i in range(5)]
FAILING = "ans2"
#: The killed controller's own ssh connection, not a ControlPersist master that outlives it (which keeps the
#: module's session open, so the module runs its transaction to its own verdict instead: see docs/design.md).
KILL_ENV = {"ANSIBLE_SSH_ARGS": "-o ControlMaster=no"}  # in the second batch of serial [1, "50%"]: [ans0], [ans1, ans2], [ans3, ans4]


@pytest.fixture(scope="module")
def fleet(sandbox, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ansible")
    artifact = collection.build(tmp / "dist")
    colls = tmp / "collections"
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(colls), str(artifact)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = {}
    for i, name in enumerate(NAMES):
        host = dataclasses.replace(standin_host(sandbox.base, f"t-ansible{i}"), name=name)
        hosts[name] = host
    install_standin(hosts[NAMES[0]])
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory_doc(list(hosts.values()))))
    env = {"ANSIBLE_COLLECTIONS_PATH": str(colls), "ANSIBLE_PIPELINING": "True", "ANSIBLE_HOST_KEY_CHECKING": "True",
           "ANSIBLE_LOCAL_TEMP": str(tmp / "ltmp"), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp / "cp"),
           "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False", "PATH": f"{BIN}:{os.environ['PATH']}"}
    yield tmp, hosts, env, artifact
    for host in hosts.values():
        remove_root(host)


def _bundles(tmp: Path, hosts, modes: dict[str, str | None], name: str) -> Path:
    out = tmp / name
    for host in hosts.values():
        write_bundle(out, host, overlay(modes.get(host.name)))
    return out


def _play(tmp: Path, env, bundles: Path, *, limit: str | None = None, check: bool = False):
    """The collection's playbook through ansible-runner: (stats, {host: module result}, [(event, host)] in order)."""
    results, order = {}, []

    def handler(event):
        data = event.get("event_data") or {}
        if data.get("task_action") == "ddtree.deploy.ddtree_release" and data.get("host"):
            order.append((event["event"], data["host"]))
            if event["event"] in ("runner_on_ok", "runner_on_failed"):
                results[data["host"]] = data["res"]
        return True
    extravars = {"ddtree_bundle_dir": str(bundles), "ddtree_serial": [1, "50%"], "ddtree_max_fail_percentage": 50}
    cmdline = " ".join((["--check", "--diff"] if check else []) + ([f"--limit={limit}"] if limit else [])) or None
    (tmp / "runner").mkdir(exist_ok=True)
    os.environ["PATH"] = env["PATH"]
    run = ansible_runner.run(private_data_dir=str(tmp / "runner"), inventory=str(tmp / "inventory.yml"),
                             playbook="ddtree.deploy.apply", extravars=extravars, envvars=env, quiet=True,
                             event_handler=handler, cmdline=cmdline, forks=5)
    return run.stats, results, order


def _show(host):
    with HostConnection(host) as conn:
        return ReleaseManager(conn).show(journal_lines=20)


def test_the_collection_builds_with_the_package_version_and_its_host_programs(fleet):
    tmp, _, _, artifact = fleet
    import tarfile

    from ddtree_deploy import __version__
    assert artifact.name == f"ddtree-deploy-{__version__}.tar.gz"
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
        programs = tar.extractfile("plugins/module_utils/_programs.py").read().decode()
    assert {"plugins/modules/ddtree_release.py", "plugins/modules/ddtree_probe.py", "plugins/modules/ddtree_rollback.py",
            "plugins/modules/ddtree_facts.py", "plugins/inventory/ddtree_hosts.py", "roles/apply/tasks/main.yml",
            "playbooks/apply.yml", "MANIFEST.json"} <= names
    assert all(f"'{m}': (" in programs for m in collection.SHIPPED)


def test_serial_batches_roll_back_the_failing_host_and_keep_the_others(fleet):
    tmp, hosts, env, _ = fleet
    stats, results, order = _play(tmp, env, _bundles(tmp, hosts, {FAILING: "crash"}, "b1"))
    assert set(results) == set(NAMES), (stats, order)
    assert stats["failures"] == {FAILING: 1}, stats
    assert set(stats["changed"]) == set(NAMES) - {FAILING}  # a failed task is counted as failed, not changed
    # batches in order: the canary done before the second batch starts, the second done before the third
    pos = {(e, h): i for i, (e, h) in enumerate(order)}
    end = {h: pos.get(("runner_on_ok", h), pos.get(("runner_on_failed", h))) for h in NAMES}
    start = {h: pos[("runner_on_start", h)] for h in NAMES}
    assert end["ans0"] < min(start["ans1"], start["ans2"])
    assert max(end["ans1"], end["ans2"]) < min(start["ans3"], start["ans4"])
    bad = results[FAILING]["report"]
    assert bad["status"] == "rolled-back" and bad["rolled_back_to"] is None and bad["exit_code"] == 1
    assert next(s for s in bad["probe"]["stages"] if s["status"] == "fail")["name"] == "startup"
    assert bad["rollback_probe"]["ok"] is True
    info = _show(hosts[FAILING])
    assert info["state"]["active"] is None and info["lock"] is None
    assert info["state"]["releases"][-1]["status"] == "bad" and info["state"]["pending"] is None
    for name in set(NAMES) - {FAILING}:
        rep = results[name]["report"]
        assert rep["status"] == "ok" and rep["probe"]["ok"], rep
        info = _show(hosts[name])
        active = next(r for r in info["state"]["releases"] if r["id"] == info["state"]["active"])
        assert active["id"] == rep["release"] and active["status"] == "good" and info["lock"] is None


def test_a_second_run_changes_nothing(fleet):
    tmp, hosts, env, _ = fleet
    stats, results, _ = _play(tmp, env, _bundles(tmp, hosts, {FAILING: "crash"}, "b1"), limit=f"all:!{FAILING}")
    assert set(results) == set(NAMES) - {FAILING}
    assert not stats.get("changed") and not stats.get("failures"), stats
    assert all(r["status"] == "unchanged" and r["changed"] is False for r in results.values())


def _fingerprint(host) -> str:
    """Every path under the release root and the installed package: type, mode, size, link target, sha256."""
    sp = f"{host.site_packages}/sglang"
    cmd = (f"cd / && find {host.release_root} {sp} -printf '%p %y %m %s %l\\n' | sort && "
           f"find {host.release_root} {sp} -type f -print0 | sort -z | xargs -0 sha256sum")
    with HostConnection(host) as conn:
        res = conn.run(cmd, timeout=120)
    assert res.exit_code == 0, res.stderr
    return res.stdout


def test_check_diff_changes_nothing_on_any_host(fleet):
    tmp, hosts, env, _ = fleet
    before = {n: _fingerprint(h) for n, h in hosts.items()}
    stats, results, _ = _play(tmp, env, _bundles(tmp, hosts, {}, "b2"), check=True)
    assert {n: _fingerprint(h) for n, h in hosts.items()} == before
    assert not stats.get("failures"), stats
    # the host that was rolled back would take the (now good) overlay; the others hold it already
    assert results[FAILING]["changed"] is True and set(stats["changed"]) == {FAILING}
    assert "+ sglang/srt/speculative/ddtree/__init__.py" in results[FAILING]["diff"]["prepared"]
    assert all(results[n]["changed"] is False for n in set(NAMES) - {FAILING})


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_a_controller_killed_during_the_probe_leaves_the_host_as_the_guardian_promises(fleet):
    tmp, hosts, env, _ = fleet
    host = hosts["ans0"]
    before = _show(host)["state"]["active"]
    bundles = _bundles(tmp, {"ans0": host}, {"ans0": "slowload"}, "b3")
    extravars = f'{{"ddtree_bundle_dir": "{bundles}", "ddtree_serial": [1]}}'
    play = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(tmp / "inventory.yml"), "--limit", "ans0",
                             "ddtree.deploy.apply", "-e", extravars], env={**os.environ, **env, **KILL_ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the new release switched in and its server starting
            pend = _show(host)["state"].get("pending")
            if pend and pend.get("stage") in ("restarting", "probing"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never reached its probe")
        for pid in [play.pid, *_descendants(play.pid)]:  # the controller and everything it started (its ssh
            try:                                          # clients run in sessions of their own)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        play.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = _show(host)
            if info["lock"] is None:
                break
            time.sleep(0.5)
    finally:
        if play.poll() is None:
            os.killpg(play.pid, signal.SIGKILL)
    state = info["state"]
    assert info["lock"] is None and state["pending"] is None and state["active"] == before, state
    assert state["releases"][-1]["status"] == "interrupted"
    settled = [e for e in info["journal"] if e.get("event") == "reconciled"]
    assert settled and settled[-1]["by"] == "guardian" and settled[-1]["outcome"] == "rolled-back", info["journal"]
    with HostConnection(host) as conn:
        assert ServerControl(conn).status()["release"] == before
