"""One inventory story and host selection like Ansible (issue 25, items 2 and 8), through the installed console
script: a checkout reads its hosts/ and the user inventory both and ``hosts list`` says where each host came from;
a host file is found or the error says where to move it; hosts are chosen by name, ``-H a,b``, glob, group
(``groups:`` in a host file, ``groups.yaml``), ``!x`` and ``--limit``, positionally or with ``-H`` on every
command; a misspelt field or subcommand gets a did-you-mean; a held lock exits 6."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hostfiles import write_host
from wheel_env import REPO

GOOD = {"python": "/usr/bin/python3", "site_packages": "/usr/lib/python3/dist-packages", "release_root": "/opt/ddtree"}


def _checkout(root: Path) -> Path:
    """A copy of the source checkout (what a clone is to the package: pyproject.toml, patches/, the package)."""
    clone = root / "clone"
    shutil.copytree(REPO / "ddtree_deploy", clone / "ddtree_deploy",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_patches"))
    shutil.copy2(REPO / "pyproject.toml", clone / "pyproject.toml")
    (clone / "patches").mkdir()
    (clone / "hosts").mkdir()
    return clone


def _file(directory: Path, name: str, **fields) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **fields}))
    return path


def _names(proc) -> set[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r.get("host") or r["name"] for r in json.loads(proc.stdout)}


def test_a_checkout_reads_its_hosts_and_the_user_inventory_and_says_which(cli, tmp_path: Path) -> None:
    clone = _checkout(tmp_path)
    home = tmp_path / "home"
    user = home / ".config" / "ddtree-deploy" / "hosts"
    _file(clone / "hosts", "sbx", address="10.0.0.8")
    _file(user, "gpu1", address="10.0.0.9", port=2222)  # where the README's first steps put it
    env = {"PYTHONPATH": str(clone), "HOME": str(home)}
    listed = cli("hosts", "list", "--json", **env)
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert listed.returncode == 0 and set(rows) == {"sbx", "gpu1"}, listed.stdout + listed.stderr
    assert rows["sbx"]["inventory"] == "checkout" and rows["gpu1"]["inventory"] == "user"
    assert rows["gpu1"]["file"] == str(user / "gpu1.yaml") and rows["gpu1"]["port"] == 2222
    table = cli("hosts", "list", **env)
    line = next(ln for ln in table.stdout.splitlines() if " gpu1 " in ln)
    assert " user " in line and "2222" in line, table.stdout
    assert str(clone / "hosts") in table.stdout and str(user) in table.stdout  # the title names both
    # one name in both: that host is unusable, the error names both files (which was meant cannot be known)
    _file(clone / "hosts", "gpu1", address="10.0.0.10")
    both = cli("releases", "gpu1", **env)
    assert both.returncode == 2 and str(clone / "hosts" / "gpu1.yaml") in both.stderr, both.stderr
    assert str(user / "gpu1.yaml") in both.stderr and "keep one of the two files" in both.stderr
    assert "Traceback" not in both.stderr


def test_an_explicit_inventory_names_the_file_it_shadows_and_where_to_move_it(cli, tmp_path: Path) -> None:
    home = tmp_path / "home"
    user = home / ".config" / "ddtree-deploy" / "hosts"
    _file(user, "gpu1", address="10.0.0.9")
    chosen = tmp_path / "team-inventory"
    _file(chosen, "other", address="10.0.0.7")
    proc = cli("releases", "gpu1", HOME=str(home), DDTREE_INVENTORY=str(chosen))
    assert proc.returncode == 2 and "unknown host 'gpu1'" in proc.stderr, proc.stderr
    assert f"{user / 'gpu1.yaml'} defines it" in proc.stderr and f"move the file to {chosen / 'gpu1.yaml'}" in proc.stderr


def test_a_misspelt_field_or_subcommand_gets_a_did_you_mean(cli, tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    _file(inv, "typo", adress="10.0.0.1", server={"kind": "managed", "comand": "x"})
    proc = cli("hosts", "list", DDTREE_INVENTORY=str(inv))
    assert proc.returncode == 2, proc.stderr
    assert "unknown field 'adress' (did you mean 'address'?" in proc.stderr
    assert "unknown field 'server.comand' (did you mean 'server.command'?" in proc.stderr
    lst = cli("snapshot", "lst", DDTREE_INVENTORY=str(inv))
    assert lst.returncode == 2 and "no such command 'lst'" in lst.stderr and "did you mean 'list'" in lst.stderr
    assert "unknown host" not in lst.stderr
    host = cli("snapshot", "nosuch-host", DDTREE_INVENTORY=str(inv))  # not close to a command: a host name
    assert host.returncode == 2 and "unknown host 'nosuch-host'" in host.stderr, host.stderr


def test_bad_host_patterns_are_usage_errors_naming_the_pattern(cli, tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    _file(inv, "gpu1", address="10.0.0.1")
    _file(inv, "gpu2", address="10.0.0.2")
    env = {"DDTREE_INVENTORY": str(inv)}
    empty = cli("hosts", "check", "-H", "gpu1,,gpu2", **env)
    assert empty.returncode == 2 and "invalid value for '--host'" in empty.stderr, empty.stderr
    nothing = cli("hosts", "check", "-H", "cpu*", **env)
    assert nothing.returncode == 2 and "unknown host pattern 'cpu*'" in nothing.stderr
    many = cli("releases", "gpu*", **env)
    assert many.returncode == 2 and "'gpu*' names 2 hosts (gpu1, gpu2)" in many.stderr, many.stderr
    twice = cli("releases", "gpu1", "--host", "gpu2", **env)
    assert twice.returncode == 2 and "two hosts given" in twice.stderr
    for command in (["bench"], ["tune"], ["probe"], ["rollback"], ["releases"], ["server", "status"]):
        proc = cli(*command, "nosuch", **env)  # every one-host command takes HOST positionally ...
        assert proc.returncode == 2 and "unknown host 'nosuch'" in proc.stderr, (command, proc.stderr)
        proc = cli(*command, "-H", "nosuch", **env)  # ... and as -H HOST
        assert proc.returncode == 2 and "unknown host 'nosuch'" in proc.stderr, (command, proc.stderr)
    for command in (["apply"], ["snapshot"], ["abi"], ["hosts", "check"]):  # and the several-host ones
        for argv in (["nosuch"], ["-H", "gpu1,nosuch"], ["--limit", "nosuch"]):
            proc = cli(*command, *argv, **env)
            assert proc.returncode == 2 and "unknown host 'nosuch'" in proc.stderr, (command, argv, proc.stderr)


@pytest.fixture()
def fleet_inventory(sandbox, tmp_path: Path) -> Path:
    """Three host files on the two sandbox hosts, with groups from a host file and from groups.yaml."""
    inv = tmp_path / "inv"
    write_host(inv, sandbox.base, name="sb-a")
    write_host(inv, sandbox.drift, name="sb-b", groups=["edge"])
    write_host(inv, sandbox.base, name="gpu-x")
    (inv / "groups.yaml").write_text("gpu: [sb-a, gpu-x]\n")
    return inv


@pytest.mark.sandbox
def test_hosts_are_chosen_by_name_list_glob_group_exclusion_and_limit(cli, fleet_inventory: Path) -> None:
    env = {"DDTREE_INVENTORY": str(fleet_inventory)}
    assert _names(cli("hosts", "check", "-H", "sb-*", "--json", **env)) == {"sb-a", "sb-b"}
    assert _names(cli("hosts", "check", "-H", "sb-a,gpu-x", "--json", **env)) == {"sb-a", "gpu-x"}
    assert _names(cli("hosts", "check", "gpu", "--json", **env)) == {"sb-a", "gpu-x"}  # groups.yaml
    assert _names(cli("hosts", "check", "edge", "--json", **env)) == {"sb-b"}  # groups: in the host file
    assert _names(cli("hosts", "check", "--limit", "edge", "--json", **env)) == {"sb-b"}
    assert _names(cli("hosts", "check", "-H", "all", "-H", "!gpu", "--json", **env)) == {"sb-b"}
    assert _names(cli("hosts", "check", "-H", "sb-*", "--limit", "gpu", "--json", **env)) == {"sb-a"}
    listed = {r["name"]: r for r in json.loads(cli("hosts", "list", "--json", **env).stdout)}
    assert listed["sb-b"]["groups"] == ["edge"] and listed["sb-a"]["groups"] == []
    one = cli("releases", "-H", "sb-a", "--json", **env)  # positional or -H, the same on every command
    assert one.returncode == 0 and json.loads(one.stdout)["root"], one.stderr
    (fleet_inventory / "groups.yaml").write_text("gpu: [sb-a, nosuch]\n")
    bad = cli("hosts", "check", "gpu", **env)
    assert bad.returncode == 2 and "groups.yaml: group 'gpu' lists unknown host 'nosuch'" in bad.stderr


@pytest.mark.sandbox
def test_a_held_lock_exits_6_not_1(cli, sandbox, tmp_path: Path) -> None:
    from ddtree_deploy.release import ReleaseManager
    from ddtree_deploy.transport import HostConnection

    inv = tmp_path / "inv"
    root = "/srv/ddtree-host/t-cli-lock"
    write_host(inv, sandbox.base, name="locked", release_root=root)
    host = dataclasses.replace(sandbox.base, name="locked", release_root=root)
    with HostConnection(host) as conn:
        holder = ReleaseManager(conn, run_id="run-held-by-test")
        holder.acquire("ddtree-deploy apply --host locked")
        try:
            proc = cli("server", "stop", "locked", DDTREE_INVENTORY=str(inv))
            as_json = cli("server", "stop", "locked", "--json", DDTREE_INVENTORY=str(inv))
        finally:
            holder.release_lock()
            conn.run(f"rm -rf {root}")
    assert proc.returncode == 6 and "another deploy is in progress" in proc.stderr, proc.stderr
    error = json.loads(as_json.stdout)["error"]
    assert as_json.returncode == 6 and error["kind"] == "locked" and error["exit_code"] == 6
