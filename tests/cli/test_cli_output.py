"""What people read (issue 16, item 10): the demo's summary at 80 columns, the journal as a table, shell
completion and -v/--verbose through the installed console script."""

from __future__ import annotations

import io
from pathlib import Path

import yaml
from rich.console import Console

from ddtree_deploy.commands.deploy import journal_table
from ddtree_deploy.sandbox.demo import steps, summary_table


def _render(renderable, width: int = 80) -> list[str]:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text().splitlines()


def test_demo_summary_keeps_exit_time_and_result_at_80_columns() -> None:
    rows = [[s.title, "1 (want 1)" if s.expect else "0", f"{10 + i}.5s", "ok"] for i, s in enumerate(steps())]
    lines = _render(summary_table(rows, 321.0))
    assert all(len(line) <= 80 for line in lines)
    for i, _ in enumerate(rows):
        assert any(f"{10 + i}.5s │ ok" in line for line in lines), i  # time and verdict whole, on one line


def test_journal_is_a_table_not_python_dicts() -> None:
    lines = [
        {"time": "2026-01-02T03:04:05Z", "event": "push", "host": "h", "release": "r1", "run": "run-a", "files": 12},
        {"time": "2026-01-02T03:04:06Z", "event": "switch", "host": "h", "from": None, "to": "r1", "run": "run-a",
         "reason": "deploy"},
    ]
    text = "\n".join(_render(journal_table(lines, "h: journal"), width=120))
    assert "{" not in text and "'" not in text
    assert "2026-01-02 03:04:05" in text and "push" in text and "files=12" in text
    assert "none → r1" in text and "reason=deploy" in text


def test_shell_completion_of_commands_and_host_names(wheel_env, tmp_path: Path) -> None:
    def complete(words: str, **env: str) -> list[str]:
        proc = wheel_env.run(**{"_DDTREE_DEPLOY_COMPLETE": "complete_bash", "COMP_WORDS": words,
                                "COMP_CWORD": str(len(words.split()) - 1), **env})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("ddtree-deploy ap") == ["apply"]
    assert set(complete("ddtree-deploy server st")) == {"start", "stop", "status"}
    inv = tmp_path / "inv"
    inv.mkdir()
    for name in ("gpu1", "gpu2", "other"):
        (inv / f"{name}.yaml").write_text(yaml.safe_dump({"address": name, "python": "/usr/bin/python3",
                                                          "site_packages": "/usr/lib/python3/dist-packages",
                                                          "release_root": "/opt/ddtree"}))
    assert complete("ddtree-deploy probe gp", DDTREE_INVENTORY=str(inv)) == ["gpu1", "gpu2"]
    # the shell is named, not detected from the parent process (under make that is sh, which typer does not support)
    script = wheel_env.run("--show-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    assert script.returncode == 0 and "_DDTREE_DEPLOY_COMPLETE" in script.stdout


def test_verbose_shows_the_debug_log_anywhere_on_the_line(wheel_env, tmp_path: Path) -> None:
    quiet = wheel_env.run("hosts", "list", "--inventory", str(tmp_path))
    assert quiet.returncode == 0 and "inventory" not in quiet.stderr
    for argv in (["-v", "hosts", "list"], ["hosts", "list", "-v"], ["hosts", "--verbose", "list"]):
        proc = wheel_env.run(*argv, "--inventory", str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        assert "ddtree_deploy.inventory: inventory" in proc.stderr and "0 host(s)" in proc.stderr, argv
