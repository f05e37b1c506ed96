"""Usage errors are one line + a hint, exit 2, never a traceback (issue 16, item 2), through the console script of
the installed wheel; ``-h`` works on every command; under ``--json`` errors are JSON on stdout."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer.main

from ddtree_deploy.cli import app


def _assert_usage_error(proc, *needles: str) -> list[str]:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  hint: "), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return lines


def test_unknown_command_suggests_the_close_one(cli) -> None:
    lines = _assert_usage_error(cli("aply", "--host", "x"), "no such command 'aply'", "did you mean 'apply'")
    assert "ddtree-deploy --help" in lines[1]
    _assert_usage_error(cli("server", "strat", "x"), "no such command 'strat'", "'start'")


def test_unknown_option_suggests_the_close_one(cli) -> None:
    _assert_usage_error(cli("apply", "--hots", "x"), "no such option --hots", "did you mean --host", "apply --help")


def test_missing_argument_names_it_and_shows_the_usage(cli) -> None:
    _assert_usage_error(cli("probe"), "missing argument 'HOST'", "usage: ddtree-deploy probe")


def test_bad_value_names_the_option(cli) -> None:
    _assert_usage_error(cli("apply", "--host", "x", "--max-parallel", "0"), "invalid value for '--max-parallel'")
    _assert_usage_error(cli("server", "logs", "x", "--lines", "many"), "'--lines'")


def _command_paths() -> list[list[str]]:
    """Every command and group of the app, as argument lists (``["server", "start"]``)."""
    paths: list[list[str]] = []

    def walk(cmd, prefix: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            paths.append([*prefix, name])
            walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_dash_h_works_everywhere_like_help(cli) -> None:
    paths = _command_paths()
    assert len(paths) >= 30 and ["server", "start"] in paths and ["patchset", "refresh"] in paths
    with ThreadPoolExecutor(4) as pool:
        short = list(pool.map(lambda p: cli(*p, "-h"), paths))
    for path, a in zip(paths, short, strict=True):
        assert a.returncode == 0 and "Usage: ddtree-deploy " + " ".join(path) in a.stdout, (path, a.stderr)
    for path in (["apply"], ["server", "start"], ["snapshot"], ["patchset", "check"]):  # -h is --help
        assert cli(*path, "--help").stdout == short[paths.index(path)].stdout, path


def test_a_group_without_a_command_prints_its_help_once(cli) -> None:
    proc = cli("server")
    assert proc.returncode == 2 and "Usage: ddtree-deploy server" in proc.stdout and "start" in proc.stdout
    assert "Traceback" not in proc.stderr
    for argv in ([], ["server"], ["snapshot"], ["hosts"]):  # issue 25, item 11: the help was printed twice
        proc = cli(*argv)
        assert proc.returncode == 2 and proc.stdout.count("Usage: ") == 1, (argv, proc.stdout)
        assert proc.stdout.count("Commands") == 1 and not proc.stderr.strip(), (argv, proc.stderr)


def test_non_utf8_host_file_is_exit_2_naming_the_file(cli, tmp_path: Path) -> None:
    inv = tmp_path / "hosts"
    inv.mkdir()
    (inv / "latin.yaml").write_bytes(b"address: gpu1\ndescription: caf\xe9\npython: /usr/bin/python3\n")
    proc = cli("probe", "latin", "--inventory", str(inv))
    lines = _assert_usage_error(proc, str(inv / "latin.yaml"), "not UTF-8", "line 2")
    assert "cannot be used" in lines[0]
    listed = cli("hosts", "list", "--inventory", str(inv))
    assert listed.returncode == 2 and str(inv / "latin.yaml") in listed.stderr and "Traceback" not in listed.stderr


@pytest.mark.parametrize("argv, kind, needle", [
    (["aply", "--json"], "usage", "no such command 'aply'"),
    (["probe", "--json"], "usage", "missing argument 'HOST'"),
    (["apply", "--json", "--host", "x", "--max-parallel", "0"], "usage", "--max-parallel"),
    (["releases", "nosuch", "--json"], "input", "unknown host 'nosuch'"),
])
def test_errors_are_json_under_json(cli, tmp_path: Path, argv: list[str], kind: str, needle: str) -> None:
    (tmp_path / "inv").mkdir()
    proc = cli(*argv, DDTREE_INVENTORY=str(tmp_path / "inv"))
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["error"]["kind"] == kind and doc["error"]["exit_code"] == 2
    assert needle in doc["error"]["message"] and doc["error"]["hint"]
    assert "Traceback" not in proc.stderr


def test_domain_errors_keep_their_exit_codes(cli, tmp_path: Path) -> None:
    """The one mapping: bad input 2, unknown patch set 2, with the file or name in the message."""
    proc = cli("patchset", "show", "nosuch/sglang-0.0.1")
    assert proc.returncode == 2 and "nosuch/sglang-0.0.1" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")


def test_the_one_mapping_from_errors_to_exit_codes() -> None:
    from ddtree_deploy import errors
    from ddtree_deploy.cli_errors import classify

    cases = [
        (errors.InputError("hosts/x.yaml: field 'port': bad", hint="fix it"), "input", 2),
        (errors.TransportError("h", "cannot connect"), "unreachable", 3),
        (errors.HostKeyError("h", "unknown host key"), "unreachable", 3),
        (errors.OperationFailed("probe failed"), "failed", 1),
        (errors.RemoteError("h", "release.show", "boom"), "failed", 1),
        (errors.AbiIncompatible("torch mismatch"), "abi", 4),
        (errors.PatchDoesNotApply("hunk 2 of 0001"), "patch", 5),
        (KeyboardInterrupt(), "interrupted", 130),
        (RuntimeError("a bug"), "internal", 1),
    ]
    for exc, kind, code in cases:
        failure = classify(exc)
        assert (failure.kind, failure.exit_code) == (kind, code), exc
        assert "\n" not in failure.message
    assert classify(cases[0][0]).hint == "fix it"
    assert "-v" in classify(RuntimeError("x")).hint
