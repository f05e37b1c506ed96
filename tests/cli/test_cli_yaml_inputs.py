"""Hostile YAML (issue 26, item 6) through the installed console script: a key given twice in a host file or a
patchset.yaml is an error naming the file and the key (YAML would silently keep the last), and a timeout must be a
finite number of seconds within the allowed range (``command_timeout: .inf`` used to be accepted, then overflowed).
Each is exit 2 with one error naming the file and field, before any host is contacted."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE = "python: /usr/bin/python3\nsite_packages: /usr/lib/python3/dist-packages\nrelease_root: /opt/ddtree\naddress: h\n"


def _error(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return next(line for line in proc.stderr.splitlines() if line.startswith("error:"))


@pytest.mark.parametrize("text, key, lines", [
    (BASE + "port: 22\nport: 2222\n", "'port'", "lines 5 and 6"),
    (BASE + "server:\n  kind: managed\n  port: 30000\n  kind: none\n", "'kind'", "lines 6 and 8"),
])
def test_a_key_given_twice_in_a_host_file_is_an_error(cli, tmp_path: Path, text: str, key: str, lines: str) -> None:
    inv = tmp_path / "hosts"
    inv.mkdir()
    (inv / "gpu1.yaml").write_text(text)
    first = _error(cli("hosts", "check", "gpu1", "--inventory", str(inv)))
    assert str(inv / "gpu1.yaml") in first and f"key {key} is given twice ({lines})" in first, first


@pytest.mark.parametrize("field, value, allowed", [
    ("command_timeout", ".inf", "0 < x <= 604800"),
    ("connect_timeout", "-.inf", "0 < x <= 604800"),
    ("command_timeout", "1e300", None),  # YAML 1.1 reads 1e300 as a string: still refused, as not a number
    ("command_timeout", "100000000", "0 < x <= 604800"),
    ("probe.startup_stall_timeout", ".nan", "0 <= x <= 604800"),
    ("server.stop_timeout", ".inf", "0 < x <= 604800"),
])
def test_timeouts_are_finite_and_bounded(cli, tmp_path: Path, field: str, value: str, allowed: str | None) -> None:
    inv = tmp_path / "hosts"
    inv.mkdir()
    section, _, name = field.rpartition(".")
    text = BASE + (f"{section}:\n  {name}: {value}\n" if section else f"{name}: {value}\n")
    (inv / "gpu1.yaml").write_text(text)
    first = _error(cli("hosts", "check", "gpu1", "--inventory", str(inv)))
    assert str(inv / "gpu1.yaml") in first and f"field '{field}'" in first, first
    if allowed:
        assert f"expected a finite number of seconds, {allowed}" in first, first


def test_a_key_given_twice_in_a_patchset_yaml_is_an_error(cli, tmp_path: Path) -> None:
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root)
    yaml_path = root / "ddtree" / "sglang-0.5.11" / "patchset.yaml"
    text = yaml_path.read_text()
    assert text.startswith("name: ddtree\nversion: 0.1.0\n")
    yaml_path.write_text(text.replace("version: 0.1.0\n", "version: 0.1.0\nversion: 9.9.9\n", 1))
    first = _error(cli("patchset", "show", "ddtree/sglang-0.5.11", "--patches", str(root)))
    assert str(yaml_path) in first and "key 'version' is given twice (lines 2 and 3)" in first, first


def test_host_file_json_schema_is_committed_in_sync_and_fits_the_examples(cli, tmp_path: Path) -> None:
    import json

    import jsonschema
    import yaml

    from ddtree_deploy.transport import TRANSPORTS

    committed = REPO / "hosts" / "host.schema.json"
    proc = cli("hosts", "schema")
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "host.schema.json"
    assert cli("hosts", "schema", "--output", str(written)).returncode == 0
    assert written.read_text() == proc.stdout
    # In sync but for one thing: the transports offered as `connection` examples may lag the registry (a new kind is
    # its module, its registry line and its tests; the registry, not the schema, accepts it at load), never list a
    # kind that is not registered, and always the built-in ones.
    schema, fresh = json.loads(committed.read_text()), json.loads(proc.stdout)
    offered = schema["properties"]["connection"].pop("examples")
    assert fresh["properties"]["connection"].pop("examples") == list(TRANSPORTS)
    assert {"ssh", "local"} <= set(offered) <= set(TRANSPORTS) and offered == [k for k in TRANSPORTS if k in offered]
    assert schema == fresh, "hosts/host.schema.json is stale: `ddtree-deploy hosts schema --output " \
        "hosts/host.schema.json`"
    schema = json.loads(committed.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for example in sorted((REPO / "hosts" / "examples").glob("*.yaml")):
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(example.read_text()))]
        assert not errors, (example, errors)
    # what the CLI refuses, an editor is told too: an unknown field, a port out of range, a relative python
    bad = {"address": "h", "python": "bin/python", "site_packages": "/s", "release_root": "/r", "port": 0, "colour": 1}
    messages = " ".join(e.message for e in validator.iter_errors(bad))
    assert "'colour' was unexpected" in messages and "0 is not valid" in messages  # port: integer 1..65535 or null
    assert "does not match '^/'" in messages
