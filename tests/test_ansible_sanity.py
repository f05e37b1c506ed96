"""``ansible-test sanity`` on the built ``ddtree.deploy`` collection (#31): compile, import, validate-modules and
yamllint, each in the virtual environment ansible-test makes for it with the requirements it pins.

The collection is the one ``ansible-galaxy collection build`` makes from this package (its module_utils carry the
host programs packed from ``ddtree_deploy/remote/`` at build time, so the checkout's tree alone does not import),
installed by ``ansible-galaxy collection install``. ansible-test downloads pip's get-pip.py from its own file server,
which a machine with only a package registry cannot reach; ``tests/ansible_sanity/get_pip_offline.py`` stands in
for it (ensurepip, then the pinned pip from the registry). ansible-test runs pip with a whitelisted environment, so
the registry settings pip sees here (its config files and ``PIP_*`` variables) are written to the pip config of a
home of the test's own, where the virtual environments go too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.ansible import collection

pytest.importorskip("ansible_runner")  # the [ansible] extra brings ansible-core, and with it ansible-test
pytestmark = pytest.mark.wheels
BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
TESTS = ("compile", "import", "validate-modules", "yamllint")


def _pip_settings() -> dict[str, str]:
    """What pip is configured with here (files and environment), as ``key -> value``."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    settings: dict[str, str] = {}
    for line in out.stdout.splitlines():
        m = re.fullmatch(r"[^.]*\.([\w-]+)='(.*)'", line.strip())
        if m:
            settings[m.group(1)] = m.group(2)
    return settings


def _pinned_pip() -> str:
    """The pip version ansible-test bootstraps its environments with (the name of its cached get-pip script)."""
    from ansible_test._internal import python_requirements

    m = re.search(r"pip='([0-9.]+)'", Path(python_requirements.__file__).read_text())
    assert m, f"{python_requirements.__file__}: no pinned pip version found (ansible-test changed its bootstrap)"
    return m.group(1)


def test_the_built_collection_passes_ansible_test_sanity(tmp_path: Path) -> None:
    artifact = collection.build(tmp_path / "dist")
    colls = tmp_path / "collections"
    r = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(colls), str(artifact)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    root = colls / "ansible_collections" / "ddtree" / "deploy"
    assert (root / "plugins" / "module_utils" / "_programs.py").is_file()  # the packed host programs
    home = tmp_path / "home"
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True)
    shutil.copy(HERE / "ansible_sanity" / "get_pip_offline.py", cache / f"get_pip_{_pinned_pip().replace('.', '_')}.py")
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(
        "[global]\n" + "".join(f"{k} = {v}\n" for k, v in _pip_settings().items()))
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(BIN / "ansible-test"), "sanity", "--python", py, "--color", "no"]
    for t in TESTS:
        cmd += ["--test", t]
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for t in TESTS:
        assert f'Running sanity test "{t}"' in out, out[-3000:]
    assert "ERROR" not in out, out[-6000:]
