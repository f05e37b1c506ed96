"""Fixtures for the CLI tests: the project's wheel installed alone into a fresh venv (see wheel_env.py)."""

from __future__ import annotations

import os

import pytest
from once import built_once
from wheel_env import WheelEnv, install_wheel, make_wheel_env


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> WheelEnv:
    """Built once per test run (about 10-40 s: a wheel build and one pip install from the registry), shared by the
    xdist workers; each worker's user has a home and a working directory of its own."""
    if os.environ.get("DDTREE_NO_REGISTRY") == "1":
        pytest.skip("DDTREE_NO_REGISTRY=1: no package registry to install the wheel's dependencies from")
    return make_wheel_env(built_once(tmp_path_factory, "wheel-venv", install_wheel), tmp_path_factory.mktemp("user"))


@pytest.fixture()
def cli(wheel_env: WheelEnv):
    """Run the installed ``ddtree-deploy`` console script from a directory outside the checkout."""
    return wheel_env.run
