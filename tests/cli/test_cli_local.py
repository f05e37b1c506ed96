"""``connection: local``: snapshot, apply, probe and rollback of a host that is this machine, through the installed
console script, on a machine where paramiko and fabric cannot be imported at all (as on the GPU box we prove on).

The host is a real Python environment with the real SGLang 0.5.11 wheel installed (the sandbox's installer), its
server the reference engine, which decodes with the runtime of the active release.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from ddtree_deploy.sandbox import make_local_host
from ddtree_deploy.snapshot import SnapshotStore

pytestmark = pytest.mark.slow
NAME = "gpu-here"
NO_SSH_LIBS = ("paramiko", "fabric", "invoke")


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def local(tmp_path_factory, wheel_env):
    root = tmp_path_factory.mktemp("local")
    host_file = make_local_host(root / "box", root / "hosts", name=NAME)
    doc = yaml.safe_load(host_file.read_text())
    poison = root / "no-ssh-libs"  # what a machine without paramiko/fabric looks like: importing them fails
    for mod in NO_SSH_LIBS:
        (poison / mod).mkdir(parents=True)
        (poison / mod / "__init__.py").write_text(f"raise ImportError('{mod} is not installed on this machine')\n")
    env = {"DDTREE_INVENTORY": str(root / "hosts"), "DDTREE_SNAPSHOTS": str(root / "snapshots"),
           "PYTHONPATH": str(poison), "TRITON_INTERPRET": "0"}

    def run(*args: str, timeout: float = 300):
        return wheel_env.run(*args, timeout=timeout, **env)

    package = Path(doc["site_packages"]) / "sglang"
    yield run, env, doc, package
    run("server", "stop", NAME, timeout=120)


def test_cli_import_and_a_local_command_never_import_ssh_libraries(local, wheel_env) -> None:
    _, env, _, _ = local
    code = (
        "import sys, importlib.abc\n"
        "seen = []\n"
        "class Spy(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {NO_SSH_LIBS!r}: seen.append(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import ddtree_deploy.cli as cli\n"
        "try:\n"
        f"    cli.main(['hosts', 'check', '{NAME}', '--json'])\n"
        "except SystemExit as exc:\n"
        "    print('EXIT', exc.code, 'SEEN', sorted(set(seen)), file=sys.stderr)\n"
    )
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # the spy sees every import attempt, none may fail
    proc = subprocess.run([str(wheel_env.venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          env=wheel_env.env(**env), cwd=wheel_env.workdir, timeout=120)
    assert "EXIT 0 SEEN []" in proc.stderr, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)[0]["sglang"] == "0.5.11"


def test_snapshot_apply_probe_rollback_of_a_local_host(local) -> None:
    run, _, doc, package = local
    before = _tree_digest(package)
    snap = run("snapshot", NAME, "--json")
    assert snap.returncode == 0, snap.stdout + snap.stderr
    taken = json.loads(snap.stdout)[0]
    assert taken["version"] == "0.5.11" and taken["files"] > 1000

    applied = run("apply", "--host", NAME, "--ignore-abi", "--json")  # this CPU torch is outside the patch set's range
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    report = json.loads(applied.stdout)
    assert report["status"] == "ok"
    stages = {s["name"]: s for s in report["probe"]["stages"]}
    assert stages["generation"]["status"] == "pass" and stages["generation"]["data"]["spec_accept_length"] >= 1.0
    assert stages["startup"]["data"]["server_runtime_path"].startswith(f"{doc['release_root']}/releases/{report['release']}/")
    assert (Path(doc["release_root"]) / "current").resolve().name == report["release"]

    probe = run("probe", NAME, "--json")
    assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]

    back = run("rollback", NAME, "--json")
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    releases = json.loads(run("releases", NAME, "--json").stdout)
    assert releases["state"]["active"] is None and releases["current"] in (None, "base")  # "no overlay": the installed package
    assert {r["id"]: r["status"] for r in releases["state"]["releases"]}[report["release"]] == "bad"
    assert _tree_digest(package) == before  # the installed package was never written to


def test_releases_table_and_verbose_log_of_the_local_host(local) -> None:
    run, _, _, _ = local
    table = run("releases", NAME)
    assert table.returncode == 0, table.stderr
    assert "journal" in table.stdout and "switch" in table.stdout and "{'" not in table.stdout
    verbose = run("hosts", "check", NAME, "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "local host (commands run here" in verbose.stderr and "hostinfo.check exit 0 in" in verbose.stderr


def test_a_bad_host_file_takes_only_its_own_host_out_of_all(local) -> None:
    run, env, _, _ = local
    bad = Path(env["DDTREE_INVENTORY"]) / "broken.yaml"
    bad.write_text("python: /usr/bin/python3\nsite_packages: /x\nrelease_root: /x/site/../y\nport: ssh\n")
    try:
        proc = run("apply", "--all", "--dry-run", "--ignore-abi", "--json")
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        doc = json.loads(proc.stdout)
        assert [r["host"] for r in doc["hosts"]] == [NAME] and doc["hosts"][0]["status"] == "dry-run"
        assert doc["ok"] is False and doc["exit_code"] == 2
        assert "broken" in doc["unusable"] and "field 'port'" in doc["unusable"]["broken"]
        assert f"{bad}" in proc.stderr and "left out" in proc.stderr  # the warning names the file
        named = run("releases", "broken")
        assert named.returncode == 2 and str(bad) in named.stderr and "Traceback" not in named.stderr
        assert run("releases", NAME).returncode == 0  # the good host is still usable
    finally:
        bad.unlink()


def test_apply_dry_run_from_another_directory_keeps_the_store_in_the_user_data_dir(local, wheel_env, tmp_path) -> None:
    """The first-hour defects: `apply --dry-run` run from some directory wrote a 34 MB ./snapshots there, and then
    (issue 25.3) a 34 MB snapshot into the user's store; a dry run takes no snapshot at all: it says it would."""
    _, env, _, _ = local
    home, cwd = tmp_path / "home", tmp_path / "somewhere"
    home.mkdir()
    cwd.mkdir()
    user_env = {k: v for k, v in env.items() if k != "DDTREE_SNAPSHOTS"}
    proc = wheel_env.run("apply", "--host", NAME, "--dry-run", "--ignore-abi", cwd=cwd, HOME=str(home), **user_env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nothing was touched" in proc.stdout and "[snapshot] take a snapshot" in proc.stdout
    assert list(cwd.iterdir()) == []
    assert not (home / ".local" / "share" / "ddtree-deploy").exists()  # the user's store: not even created
    taken = wheel_env.run("snapshot", "take", NAME, cwd=cwd, HOME=str(home), **user_env)
    assert taken.returncode == 0, taken.stderr[-2000:]
    store = home / ".local" / "share" / "ddtree-deploy" / "snapshots"
    snapshots = SnapshotStore(store)
    assert snapshots.latest(NAME) is not None and snapshots.stored_blobs() and list(cwd.iterdir()) == []
