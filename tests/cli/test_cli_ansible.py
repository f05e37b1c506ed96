"""``apply`` / ``probe`` / ``rollback --engine ansible`` (#31) through the installed console script, on three copies of
the sandbox's base host (each its own release root and reference-engine server on the same sshd): the wheel's own
collection is built and driven by ansible-runner, batches are Ansible's ``serial``, the recap and the JSON are the
builtin engine's.

The hosts' snapshots are taken first (the ansible engine builds each overlay against one). In file order: ``--dry-run`` (Ansible's ``--check --diff``) writes nothing on any host; a canary-then-halves apply
deploys all three; ``probe --engine ansible`` passes; a second apply changes nothing; ``rollback --engine ansible``
puts one host back on the installed package."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hostcopy import base_host_doc

from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
NAMES = ("ansa", "ansb", "ansc")
FLAGS = "--speculative-algorithm DFLASH --speculative-ddtree-budget 16"


@pytest.fixture(scope="module")
def box(sandbox, wheel_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-ansible")
    inv = root / "hosts"
    inv.mkdir()
    files = {}
    for name in NAMES:
        doc = base_host_doc(sandbox, name, f"/srv/ddtree-host/cli-ansible-{name}")
        doc["server"]["ddtree_flags"] = FLAGS
        files[name] = inv / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(root / "snapshots")}

    def run(*args: str, timeout: float = 900):
        return wheel_env.run(*args, timeout=timeout, **env)

    taken = run("snapshot", "take", ",".join(NAMES))  # the overlay is built against each host's snapshot
    assert taken.returncode == 0, taken.stdout[-3000:] + taken.stderr[-3000:]
    yield run, files
    for name, f in files.items():
        run("server", "stop", name, timeout=120)
        host = load_host_file(f)
        with HostConnection(host) as conn:
            conn.run(f"rm -rf {host.release_root}", check=False)


def _state(host_file: Path) -> tuple[dict, dict]:
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        return ReleaseManager(conn).show(), ServerControl(conn).status()


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_check_diff_writes_nothing_on_any_host(box) -> None:
    run, files = box
    before = {n: _state(f) for n, f in files.items()}
    doc = _json(run("apply", "-H", ",".join(NAMES), "--engine", "ansible", "--dry-run", "--ignore-abi", "--json"))
    assert {h["host"] for h in doc["hosts"]} == set(NAMES), doc
    assert all(h["status"] == "dry-run" for h in doc["hosts"]), doc["hosts"]
    assert {n: _state(f) for n, f in files.items()} == before


def test_canary_then_halves_deploys_every_host(box) -> None:
    run, files = box
    p = run("apply", "-H", ",".join(NAMES), "--engine", "ansible", "--serial", "1,50%", "--ignore-abi",
            "--no-baseline")
    text = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 0, text[-4000:]
    for name, f in files.items():
        assert name in text
        info, server = _state(f)
        active = next(r for r in info["state"]["releases"] if r["id"] == info["state"]["active"])
        assert active["status"] == "good" and info["lock"] is None and server["running"], (name, info, server)
        assert server["release"] == active["id"]


def test_probe_through_ansible_passes(box) -> None:
    run, _ = box
    doc = _json(run("probe", NAMES[1], "--engine", "ansible", "--json"))
    assert doc["ok"] is True and {s["name"] for s in doc["stages"]} >= {"overlay", "startup", "generation"}, doc
    # the module's two reads of the server's DDTree counters, a second apart once the probe is over: nothing decoded
    # then ("idle", no speed made up); since start, the accept length is 1 + accepted / drafts (none before a draft)
    live = doc["live"]
    assert live["status"] == "idle" and live["decode_tokens_per_s"] is None and 0.9 <= live["window_s"] < 5, live
    since = live["since_start"]
    assert live["mean_acceptance_length_since_start"] == (
        round(1 + since["accepted_tokens"] / since["drafts"], 3) if since["drafts"] else None), live
    assert set(live["definitions"]) >= {"mean_acceptance_length", "decode_tokens_per_s", "window_s"}


def test_a_second_apply_changes_nothing(box) -> None:
    run, files = box
    pids = {n: _state(f)[1]["pid"] for n, f in files.items()}
    doc = _json(run("apply", "-H", ",".join(NAMES), "--engine", "ansible", "--ignore-abi", "--no-baseline", "--json"))
    assert [h["status"] for h in doc["hosts"]] == ["unchanged"] * len(NAMES), doc["hosts"]
    assert {n: _state(f)[1]["pid"] for n, f in files.items()} == pids  # nothing restarted


def test_rollback_through_ansible(box) -> None:
    run, files = box
    name = NAMES[2]
    p = run("rollback", name, "--engine", "ansible")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    info, server = _state(files[name])
    assert info["state"]["active"] is None and info["lock"] is None, info["state"]
    assert server["release"] is None and server["running"], server  # back on the installed package, serving
