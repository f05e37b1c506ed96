"""Build hook: the wheel carries the DDTree patch sets as package data (``ddtree_deploy/_patches``).

The patch sets stay where the repo layout promises (top-level ``patches/``); setuptools can only ship files that
sit inside a package, so ``build_py`` copies them in at build time. Folders are picked by pattern, not by name:
the shared runtime (``patches/<name>/runtime/``) and every base folder (``patches/<name>/sglang-<version>/``), so
a new base ships without editing this file. Everything else lives in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "patches"
TARGET = Path("ddtree_deploy") / "_patches"
#: Folders under patches/ that ship, as glob patterns relative to it.
SHIPPED = ("*/runtime", "*/sglang-*")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".pytest_cache")


class build_py_with_patches(build_py):
    """``build_py`` plus a copy of the shipped patch-set folders into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which finds patches/ itself (ddtree_deploy.paths)
        dest_root = Path(self.build_lib) / TARGET
        shutil.rmtree(dest_root, ignore_errors=True)
        folders = sorted({p for pattern in SHIPPED for p in SOURCE.glob(pattern) if p.is_dir()})
        if not folders:
            raise SystemExit(f"no patch sets under {SOURCE} (expected {', '.join(SHIPPED)})")
        for folder in folders:
            shutil.copytree(folder, dest_root / folder.relative_to(SOURCE), ignore=SKIP)


setup(cmdclass={"build_py": build_py_with_patches})
