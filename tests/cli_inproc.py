"""The command line run in-process, for tests that need no sshd: typer's CliRunner isolation around ``cli.main``.

``cli.main`` is the console script's own entry, so the exit codes, the one-line errors and ``--json`` output are the
ones a user sees; only the Python start-up (about a second per call on a loaded 2-core box) is saved. The tests that
must go through the real console script of the installed wheel stay in ``tests/cli/`` (``wheel_env``).

The result is a ``subprocess.CompletedProcess`` (``returncode``, ``stdout``, ``stderr``), so a test reads the same
whichever way it ran the command.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from typer.testing import CliRunner

from ddtree_deploy import cli, console


def run_cli(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            columns: int = 80) -> subprocess.CompletedProcess[str]:
    """``ddtree-deploy ARGS`` in this process. ``env`` is the whole environment of the run (as for subprocess: a
    variable missing from it is unset for the call); ``columns`` is the terminal width the tables are laid out for."""
    overrides: dict[str, str | None] = {}
    if env is not None:
        overrides = {k: None for k in os.environ if k not in env}
        overrides.update(env)
    overrides["COLUMNS"] = str(columns)
    root = logging.getLogger()
    saved_logging = (root.handlers[:], root.level, logging.getLogger("ddtree_deploy").level)
    saved_width = (console.out._width, console.err._width)
    console.out.width = console.err.width = columns
    here = Path.cwd()
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with CliRunner().isolation(env=overrides) as (stdout, stderr, _both):
            try:
                cli.main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            out_text, err_text = stdout.getvalue().decode(), stderr.getvalue().decode()
    finally:
        os.chdir(here)
        console.out._width, console.err._width = saved_width
        root.handlers[:], root.level = saved_logging[0], saved_logging[1]
        logging.getLogger("ddtree_deploy").setLevel(saved_logging[2])
    return subprocess.CompletedProcess(["ddtree-deploy", *args], code, out_text, err_text)
