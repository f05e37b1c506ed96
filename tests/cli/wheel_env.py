"""Build the project's wheel and install it alone into a fresh virtual environment (no dev extras, no checkout).

Used by the CLI tests, which run the installed console script the way a user does: from another directory, with
a home of its own, and no DDTREE_* variables. The wheel is built from a copy of the files a release is made of, so
the check also proves the build needs nothing else from the checkout. Dependencies come from the package
registry (CI reaches it); without one the tests are skipped locally and fail under CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What an sdist / a build needs (MANIFEST.in and setup.py say the same).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ddtree_deploy", "patches", "ansible_collections")


@dataclass
class WheelEnv:
    wheel: Path
    venv: Path
    home: Path
    workdir: Path

    @property
    def script(self) -> Path:
        return self.venv / "bin" / "ddtree-deploy"

    def env(self, **extra: str) -> dict[str, str]:
        """A user's environment: our PATH, a home of its own, nothing of ours that would point into the checkout."""
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("DDTREE_", "PYTHON", "VIRTUAL_ENV", "XDG_")) and k not in ("HOME", "COLUMNS")}
        return {**keep, "HOME": str(self.home), "COLUMNS": "200", **extra}

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.script), *args], cwd=cwd or self.workdir, env=self.env(**extra),
                              capture_output=True, text=True, timeout=timeout)


def _pip(python: Path | str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """pip without the caller's PYTHONPATH / PYTHONHOME: a PYTHONPATH with an empty entry puts the checkout on the
    venv's path, and pip then finds the project "already satisfied" and installs only its dependencies."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_TARGET", "PIP_PREFIX")}
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd or "/",
                          env=env, capture_output=True, text=True, timeout=900)


def build_wheel(dest: Path) -> Path:
    """Build the wheel from a copy of the release inputs (the checkout is not written to)."""
    src = dest / "src"
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_patches"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    out = dest / "dist"
    proc = _pip(sys.executable, "wheel", "--no-deps", "-w", str(out), str(src))
    if proc.returncode != 0:
        raise RuntimeError(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    wheels = sorted(out.glob("ddtree_deploy-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def install_wheel(root: Path) -> None:
    """Wheel (``root/build``) -> fresh venv (``root/venv``, no system site-packages) -> ``pip install`` of the
    wheel alone with its ``ansible`` and ``plot`` extras, deps from the registry. Read-only afterwards: the test run's workers share it."""
    wheel = build_wheel(root / "build")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    # with its extras: Ansible (--engine ansible) and matplotlib (bench / tune --plot)
    proc = _pip(venv / "bin" / "python", "install", f"{wheel}[ansible,plot]")
    if proc.returncode != 0:
        raise RuntimeError(f"pip install of the wheel into a fresh venv failed:\n{proc.stdout}\n{proc.stderr}")
    if not (venv / "bin" / "ddtree-deploy").exists():
        raise RuntimeError(f"pip install of {wheel.name} exited 0 but left no {venv}/bin/ddtree-deploy:\n{proc.stdout}\n{proc.stderr}")


def make_wheel_env(installed: Path, user: Path) -> WheelEnv:
    """The venv of :func:`install_wheel` at ``installed``, used by a user with a home and a working directory of
    their own under ``user`` (what the CLI writes lands there, never in the shared venv)."""
    wheel = next((installed / "build" / "dist").glob("ddtree_deploy-*.whl"))
    home, workdir = user / "home", user / "elsewhere"
    home.mkdir()
    workdir.mkdir()
    return WheelEnv(wheel=wheel, venv=installed / "venv", home=home, workdir=workdir)
