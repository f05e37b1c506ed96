"""Inventory validation: every bad host file is refused with its file and field named, exit 2 from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_inproc import run_cli

from ddtree_deploy.errors import InputError
from ddtree_deploy.inventory import load_host_file, load_inventory, resolve_host, scan_inventory

REPO = Path(__file__).resolve().parent.parent

GOOD = {
    "address": "gpu1.example",
    "user": "deploy",
    "python": "/opt/venv/bin/python",
    "site_packages": "/opt/venv/lib/python3.12/site-packages",
    "release_root": "/opt/ddtree",
}


def write(tmp_path: Path, doc: object, name: str = "gpu1.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_good_host_gets_defaults_and_name_from_file(tmp_path: Path) -> None:
    host = load_host_file(write(tmp_path, GOOD))
    assert host.name == "gpu1"
    assert host.target == "gpu1.example"
    assert host.connect_timeout == 10.0 and host.command_timeout == 600.0
    assert host.trust_on_first_use is False
    assert host.server["kind"] == "none"
    assert host.probe["max_new_tokens"] == 32


@pytest.mark.parametrize(
    "change, field, expected",
    [
        ({"port": "ssh"}, "port", "expected an integer"),
        ({"port": 70000}, "port", "between 1 and 65535"),
        ({"python": "venv/bin/python"}, "python", "absolute path"),
        ({"trust_on_first_use": "yes"}, "trust_on_first_use", "true or false"),
        ({"colour": "blue"}, "colour", "unknown field"),
        ({"server": {"kind": "docker"}}, "server.kind", "expected one of"),
        ({"server": {"port": "x"}}, "server.port", "expected an integer"),
        ({"probe": {"prompts": "hello"}}, "probe.prompts", "expected a list"),
        ({"probe": {"prompts": [1]}}, "probe.prompts[0]", "expected a string"),
        ({"probe": {"startup_timeout": -1}}, "probe.startup_timeout", "expected a finite number of seconds, 0 < x"),
    ],
)
def test_bad_field_is_named_with_file(tmp_path: Path, change: dict, field: str, expected: str) -> None:
    path = write(tmp_path, {**GOOD, **change})
    with pytest.raises(InputError) as info:
        load_host_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"'{field}'" in message
    assert expected in message


@pytest.mark.parametrize("missing", ["python", "site_packages", "release_root"])
def test_missing_required_field(tmp_path: Path, missing: str) -> None:
    doc = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(InputError, match=rf"missing required field '{missing}'"):
        load_host_file(write(tmp_path, doc))


def test_address_or_alias_required(tmp_path: Path) -> None:
    doc = {k: v for k, v in GOOD.items() if k != "address"}
    with pytest.raises(InputError, match="'address'"):
        load_host_file(write(tmp_path, doc))
    assert load_host_file(write(tmp_path, {**doc, "ssh_alias": "gpu1"}, "alias.yaml")).target == "gpu1"


def test_not_yaml_and_not_mapping(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("address: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_host_file(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(InputError, match="expected a mapping"):
        load_host_file(bad)


def test_duplicate_names_take_both_hosts_out_naming_both_files(tmp_path: Path) -> None:
    write(tmp_path, {**GOOD, "name": "same"}, "a.yaml")
    write(tmp_path, {**GOOD, "name": "same"}, "b.yaml")
    write(tmp_path, GOOD, "other.yaml")
    assert set(load_inventory(tmp_path)) == {"other"}
    with pytest.raises(InputError, match=r"b\.yaml.*already defined in .*a\.yaml"):
        resolve_host("same", tmp_path)


def test_shipped_examples_validate_and_are_not_in_the_default_inventory() -> None:
    hosts = load_inventory(REPO / "hosts" / "examples")
    assert {"ct129", "ct200", "gpu-local"} <= set(hosts)
    assert hosts["ct200"].ssh_alias == "ct200"
    assert hosts["ct129"].server["kind"] == "managed"
    assert hosts["gpu-local"].connection == "local"
    assert not list((REPO / "hosts").glob("ct*.yaml"))  # `hosts check` / `apply --all` on hosts/ never meet them


def test_default_inventory_of_the_checkout_holds_no_examples() -> None:
    """`hosts check` and `apply --all` on the checkout's hosts/ meet only what the sandbox wrote there."""
    inventory = scan_inventory(REPO / "hosts")
    assert not inventory.broken
    assert all(h.sandbox for h in inventory.hosts.values()), sorted(inventory.hosts)


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    doc = {**GOOD, "port": "ssh", "colour": "blue", "python": "venv/bin/python", "server": {"kind": "docker"}}
    del doc["release_root"]
    path = write(tmp_path, doc)
    with pytest.raises(InputError) as info:
        load_host_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: 5 problems:")
    for needle in ("field 'port': expected an integer", "unknown field 'colour'", "field 'python': expected an absolute",
                   "field 'server.kind': expected one of", "missing required field 'release_root'"):
        assert needle in message, needle
    assert len(message.splitlines()) == 6


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", ".hidden", "sp ace", "x" * 65, "semi;colon"])
def test_unsafe_host_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match=r"field 'name': expected a plain host name"):
        load_host_file(write(tmp_path, {**GOOD, "name": name}))


@pytest.mark.parametrize("release_root, inside", [
    ("/opt/venv/lib/python3.12/site-packages", "site-packages"),
    ("/opt/venv/lib/python3.12/site-packages/ddtree", "site-packages"),
    ("/opt/venv/lib/python3.12/site-packages/sglang", "the installed package"),
    ("/opt/venv/lib/python3.12/site-packages/sglang/srt/../ddtree", "the installed package"),
    ("/opt/venv/lib/python3.12/./site-packages/x", "site-packages"),
])
def test_release_root_inside_site_packages_or_the_package_is_refused(tmp_path: Path, release_root: str, inside: str) -> None:
    path = write(tmp_path, {**GOOD, "release_root": release_root})
    with pytest.raises(InputError) as info:
        load_host_file(path)
    assert str(path) in str(info.value) and "field 'release_root'" in str(info.value)
    assert f"must be outside {inside}" in str(info.value)


def test_release_root_beside_site_packages_is_fine(tmp_path: Path) -> None:
    host = load_host_file(write(tmp_path, {**GOOD, "release_root": "/opt/venv/ddtree"}))
    assert host.release_root == "/opt/venv/ddtree"
    with pytest.raises(InputError, match="field 'release_root': expected an absolute path"):
        load_host_file(write(tmp_path, {**GOOD, "release_root": "ddtree"}))


def test_local_connection_needs_no_address_and_refuses_ssh_fields(tmp_path: Path) -> None:
    local = {k: v for k, v in GOOD.items() if k not in ("address", "user")}
    host = load_host_file(write(tmp_path, {**local, "connection": "local"}))
    assert host.connection == "local" and host.target == "local"
    with pytest.raises(InputError) as info:
        load_host_file(write(tmp_path, {**local, "connection": "local", "address": "x", "port": 22}))
    assert "field 'address': not used with connection: local" in str(info.value)
    assert "field 'port': not used with connection: local" in str(info.value)
    with pytest.raises(InputError, match="expected one of 'ssh', 'local'"):
        load_host_file(write(tmp_path, {**GOOD, "connection": "telnet"}))


def test_one_bad_file_takes_only_its_own_host_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, GOOD, "good.yaml")
    write(tmp_path, {**GOOD, "port": "ssh"}, "bad.yaml")
    with caplog.at_level("WARNING", logger="ddtree_deploy.inventory"):
        hosts = load_inventory(tmp_path)
    assert set(hosts) == {"good"}
    warning = caplog.records[0].getMessage()
    assert str(tmp_path / "bad.yaml") in warning and "'port'" in warning and "left out" in warning
    assert resolve_host("good", tmp_path).name == "good"
    with pytest.raises(InputError, match=r"host 'bad' cannot be used: .*bad\.yaml: field 'port'") as info:
        resolve_host("bad", tmp_path)
    assert info.value.exit_code == 2


def test_cli_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    write(tmp_path, {**GOOD, "port": "ssh"})
    write(tmp_path, GOOD, "good.yaml")
    proc = run_cli("hosts", "list", "--inventory", str(tmp_path), "--json")
    assert proc.returncode == 2
    assert "gpu1.yaml" in proc.stderr and "'port'" in proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["good"]["ok"] is True and rows["gpu1"]["ok"] is False and "'port'" in rows["gpu1"]["error"]


def _fleet(tmp_path: Path) -> Path:
    for name, groups in (("gpu1", ["gpu"]), ("gpu2", ["gpu", "eu"]), ("cpu1", [])):
        write(tmp_path, {**GOOD, "groups": groups}, f"{name}.yaml")
    (tmp_path / "groups.yaml").write_text("edge: [cpu1, gpu2]\n")
    return tmp_path


def _select(directory: Path, *patterns: str, limit: tuple[str, ...] = ()) -> list[str]:
    hosts, _ = scan_inventory(directory).select(patterns, limit)
    return [h.name for h in hosts]


def test_patterns_choose_hosts_like_ansible(tmp_path: Path) -> None:
    inv = _fleet(tmp_path)
    assert _select(inv, "gpu2", "gpu1") == ["gpu2", "gpu1"]  # the order given (the first is the canary)
    assert _select(inv, "gpu*") == ["gpu1", "gpu2"]
    assert _select(inv, "gpu") == ["gpu1", "gpu2"]  # a group from the host files' groups:
    assert _select(inv, "edge") == ["cpu1", "gpu2"]  # a group from groups.yaml
    assert _select(inv, "all", "!gpu") == ["cpu1"]
    assert _select(inv, "all", limit=("eu",)) == ["gpu2"]
    assert _select(inv, "gpu1", "gpu") == ["gpu1", "gpu2"]  # each host once
    assert sorted(scan_inventory(inv).groups) == ["edge", "eu", "gpu"]
    assert not (scan_inventory(inv).hosts.keys() & {"groups"})  # groups.yaml is not a host file
    with pytest.raises(InputError, match=r"unknown host pattern 'tpu\*'"):
        _select(inv, "tpu*")
    with pytest.raises(InputError, match="leaves none of the selected hosts"):
        _select(inv, "cpu1", limit=("gpu",))
    with pytest.raises(InputError) as info:
        _select(inv, "gpu3")
    assert "did you mean " in (info.value.hint or "") and "'gpu1'" in info.value.hint


def test_a_pattern_takes_unusable_hosts_in_as_reported_but_naming_one_raises(tmp_path: Path) -> None:
    inv = _fleet(tmp_path)
    write(tmp_path, {**GOOD, "port": "ssh"}, "gpu3.yaml")
    hosts, unusable = scan_inventory(inv).select(["gpu*"])
    assert [h.name for h in hosts] == ["gpu1", "gpu2"] and "field 'port'" in unusable["gpu3"]
    hosts, unusable = scan_inventory(inv).select(["all"], ["gpu1", "gpu3*"])  # --limit keeps what it also names
    assert [h.name for h in hosts] == ["gpu1"] and list(unusable) == ["gpu3"]
    with pytest.raises(InputError, match="host 'gpu3' cannot be used"):
        scan_inventory(inv).select(["gpu3"])


def test_bad_groups_are_errors_naming_the_file(tmp_path: Path) -> None:
    inv = _fleet(tmp_path)
    (inv / "groups.yaml").write_text("edge: cpu1\n")
    with pytest.raises(InputError, match=r"groups\.yaml: group 'edge': expected a list of host names"):
        scan_inventory(inv)
    (inv / "groups.yaml").write_text("gpu1: [cpu1]\n")
    with pytest.raises(InputError, match="group 'gpu1' has the name of a host"):
        scan_inventory(inv)
    write(tmp_path, {**GOOD, "groups": ["a/b"]}, "cpu2.yaml")
    (inv / "groups.yaml").unlink()
    assert "field 'groups" in scan_inventory(inv).broken["cpu2"].message


def test_unknown_field_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"unknown field 'adress' \(did you mean 'address'\?"):
        load_host_file(write(tmp_path, {**GOOD, "adress": "x"}))
