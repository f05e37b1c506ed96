"""Inventory validation: every bad host file is refused with its file and field named, exit 2 from the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddtree_deploy.errors import InputError
from ddtree_deploy.inventory import load_host_file, load_inventory

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
        ({"probe": {"startup_timeout": -1}}, "probe.startup_timeout", "positive"),
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


def test_duplicate_names_name_both_files(tmp_path: Path) -> None:
    write(tmp_path, {**GOOD, "name": "same"}, "a.yaml")
    write(tmp_path, {**GOOD, "name": "same"}, "b.yaml")
    with pytest.raises(InputError, match=r"b\.yaml.*already defined in .*a\.yaml"):
        load_inventory(tmp_path)


def test_shipped_examples_validate() -> None:
    hosts = load_inventory(REPO / "hosts")
    assert {"ct129", "ct200"} <= set(hosts)
    assert hosts["ct200"].ssh_alias == "ct200"
    assert hosts["ct129"].server["kind"] == "managed"


def test_cli_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    write(tmp_path, {**GOOD, "port": "ssh"})
    proc = subprocess.run([sys.executable, "-m", "ddtree_deploy", "hosts", "list", "--inventory", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "gpu1.yaml" in proc.stderr and "'port'" in proc.stderr
