"""Build hook: the wheel carries the DDTree patch sets as package data (``ddtree_deploy/_patches``).

The patch sets stay where the repo layout promises (top-level ``patches/``); setuptools can only ship files that
sit inside a package, so ``build_py`` copies them in at build time. The whole tree is copied (caches aside), not a
list of names: the shared runtime, every base folder (``patches/<name>/sglang-<version>/``) and any other folder a
patch set vendors (``vendor:`` sources such as ``patches/ddtree/spec-v2/``), so a new base or vendored folder ships
without editing this file. Everything else lives in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "patches"
TARGET = Path("ddtree_deploy") / "_patches"
# The ddtree.deploy Ansible collection's source ships as ddtree_deploy/_collection (ddtree_deploy.ansible.collection
# lays it out, with the host programs, for `apply --engine ansible`).
COLLECTION = HERE / "ansible_collections" / "ddtree" / "deploy"
COLLECTION_TARGET = Path("ddtree_deploy") / "_collection"
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".pytest_cache", ".mypy_cache", ".ruff_cache")


class build_py_with_patches(build_py):
    """``build_py`` plus a copy of the patches/ tree and of the Ansible collection's source into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which finds patches/ itself (ddtree_deploy.paths)
        if not list(SOURCE.glob("*/*/patchset.yaml")):
            raise SystemExit(f"no patch sets under {SOURCE} (expected patches/<name>/<base>/patchset.yaml)")
        dest = Path(self.build_lib) / TARGET
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(SOURCE, dest, ignore=SKIP)
        if not (COLLECTION / "galaxy.yml").is_file():
            raise SystemExit(f"no Ansible collection at {COLLECTION} (expected its galaxy.yml)")
        dest = Path(self.build_lib) / COLLECTION_TARGET
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(COLLECTION, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_programs.py", "output"))


setup(cmdclass={"build_py": build_py_with_patches})
