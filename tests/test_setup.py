"""The README's set-up never touches the interpreter make was started with: everything goes into a project venv.

A Debian/Ubuntu system Python refuses `pip install` (PEP 668, ``EXTERNALLY-MANAGED``), and on a shared machine a
`pip install -e .` into whatever `python3` is on PATH silently re-points another checkout's install. The Makefile
makes `.venv/` (``VENV=``) from ``BOOTSTRAP`` (default ``python3``) and runs every pip and every target with the
venv's own interpreter.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PY", "VENV", "BOOTSTRAP", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "-C", str(REPO), *args], capture_output=True, text=True, timeout=timeout, env=env)


def _externally_managed_python() -> str | None:
    """A Python on this machine that refuses pip by PEP 668 and can make venvs, or None."""
    probe = ("import sys, sysconfig, os; m = os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'); "
             "print(sys.prefix == sys.base_prefix and os.path.exists(m))")
    for cand in ("/usr/bin/python3", shutil.which("python3") or "", sys._base_executable):
        if not cand or not os.path.exists(cand):
            continue
        out = subprocess.run([cand, "-c", probe], capture_output=True, text=True)
        if out.stdout.strip() == "True":
            return cand
    return None


def test_every_pip_install_of_make_install_runs_in_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    out = _make("-n", "-B", "install", f"VENV={venv}", "BOOTSTRAP=/nonexistent/python3")
    assert out.returncode == 0, out.stderr
    pip_lines = [ln for ln in out.stdout.splitlines() if " pip install" in ln]
    assert len(pip_lines) >= 4, out.stdout  # torch+triton, the project, the ServerArgs deps, the v2 folders
    for ln in pip_lines:
        assert f"{venv}/bin/python -m pip install" in ln, ln
    # the bootstrap interpreter only ever makes the venv
    modules = re.findall(r"/nonexistent/python3 -m (\S+)", out.stdout)
    assert modules and set(modules) == {"venv"}, out.stdout


def test_targets_run_with_the_venv_python(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    for target in ("demo", "test", "test-fast", "lint"):
        out = _make("-n", target, f"VENV={venv}")
        assert out.returncode == 0, out.stderr
        runs = [ln for ln in out.stdout.splitlines() if ln.startswith(f"{venv}/bin/python -m ")]
        assert runs, f"make -n {target}:\n{out.stdout}"


def test_py_chooses_an_interpreter_and_no_venv_is_made(tmp_path: Path) -> None:
    out = _make("-n", "-B", "install", f"PY={sys.executable}", f"VENV={tmp_path / 'v'}")
    assert out.returncode == 0, out.stderr
    assert " -m venv " not in out.stdout
    assert f"{shlex.quote(sys.executable)} -m pip install" in out.stdout or f"{sys.executable} -m pip install" in out.stdout


def test_the_venv_is_made_from_an_externally_managed_python_without_touching_it(tmp_path: Path) -> None:
    system = _externally_managed_python()
    if system is None:
        pytest.skip("needs an externally-managed system Python (PEP 668) on this machine")
    site = subprocess.run([system, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                          capture_output=True, text=True, check=True).stdout.split()
    before = {d: sorted(os.listdir(d)) for d in site if os.path.isdir(d)}
    refused = subprocess.run([system, "-m", "pip", "install", "--dry-run", "six"], capture_output=True, text=True)
    assert refused.returncode != 0 and "externally-managed-environment" in (refused.stdout + refused.stderr)

    venv = tmp_path / "v"
    out = _make(f"VENV={venv}", f"BOOTSTRAP={system}", f"{venv}/bin/python", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    prefix = subprocess.run([str(venv / "bin/python"), "-c", "import sys; print(sys.prefix, sys.base_prefix)"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert Path(prefix[0]) == venv and prefix[0] != prefix[1]
    assert subprocess.run([str(venv / "bin/python"), "-m", "pip", "--version"], capture_output=True).returncode == 0
    assert {d: sorted(os.listdir(d)) for d in site if os.path.isdir(d)} == before
    assert sysconfig.get_path("stdlib")  # the test ran under some interpreter; the system one stayed as it was
