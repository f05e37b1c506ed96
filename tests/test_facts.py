"""Facts read from real sandbox hosts over SSH, checked against what this machine knows independently.

The sandbox hosts run this machine's interpreter (a venv with system site-packages) inside their own mount
namespace, so python version, glibc and the torch build must equal what we read locally; the sglang files must equal
the wheel installed in the host's tree. A host without torch, with a broken torch or with a hanging torch import
still yields facts, with torch marked accordingly.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.facts import gather
from ddtree_deploy.sandbox import MOUNT_POINT, PY_TAG
from ddtree_deploy.transport import HostConnection

pytestmark = pytest.mark.sandbox


def host_fs(sandbox, name: str) -> Path:
    return sandbox.box.load_state().hosts[name].fs


def test_facts_of_real_host(sandbox) -> None:
    f = gather(sandbox.base)
    assert f["host"] == "sandbox-base" and f["schema"] == 1
    assert f["python"]["version"] == platform.python_version()
    assert f["python"]["abi_tag"] == f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f["python"]["executable"] == sandbox.base.python
    assert f["glibc"] == os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    local_torch = importlib.metadata.version("torch")
    assert f["torch"]["status"] == "ok", f["torch"]
    assert f["torch"]["version"] == local_torch
    assert f["torch"]["release"] + ("+" + f["torch"]["local"] if f["torch"]["local"] else "") == local_torch
    assert isinstance(f["torch"]["cxx11_abi"], bool)
    if shutil.which("nvidia-smi") is None:
        assert f["gpu"]["status"] == "absent" and f["gpu"]["gpus"] == [] and f["gpu"]["driver"] is None
    sglang = f["packages"]["sglang"]
    assert sglang["version"] == "0.5.11" and f["sglang"]["version"] == "0.5.11"
    assert sglang["requires_torch"] == "==2.11.0"  # from the real 0.5.11 METADATA
    assert sglang["pins"]["sglang-kernel"] == "==0.4.2"
    site = host_fs(sandbox, "sandbox-base") / "venv" / "lib" / PY_TAG / "site-packages"
    local_so = sorted(str(p.relative_to(site)) for p in (site / "sglang").rglob("*.so"))
    assert [c["path"] for c in f["sglang"]["compiled"]] == local_so
    assert f["sglang"]["dist_info"] == "sglang-0.5.11.dist-info"


def test_facts_of_compiled_wheel(sandbox) -> None:
    """0.5.23 ships a libtorch-linked extension and a platform wheel tag; the facts must say so."""
    f = gather(sandbox.drift)
    assert f["sglang"]["wheel_tags"] == ["cp311-cp311-manylinux_2_34_x86_64"]
    assert f["sglang"]["root_is_purelib"] is False
    compiled = {c["path"]: c for c in f["sglang"]["compiled"]}
    mem_cache = compiled["sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-311-x86_64-linux-gnu.so"]
    assert mem_cache["links_libtorch"] and {"libtorch_cpu.so", "libc10.so"} <= set(mem_cache["needed"])
    assert all(c["glibc_max"] == "2.34" for c in compiled.values())
    assert len(compiled) == 5


@pytest.fixture()
def bare_python(sandbox):
    """A second interpreter on the base host whose environment has no torch (a venv without system packages)."""
    fs = host_fs(sandbox, "sandbox-base")
    name = "venv-facts-test"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fs / name)], check=True)
    torch_dir = fs / name / "lib" / PY_TAG / "site-packages" / "torch"
    host = dataclasses.replace(sandbox.base, python=f"{MOUNT_POINT}/{name}/bin/python")
    yield host, torch_dir
    shutil.rmtree(fs / name)


def test_host_without_torch_still_has_facts(sandbox, bare_python) -> None:
    host, _ = bare_python
    f = gather(host)
    assert f["torch"]["status"] == "missing" and f["torch"]["version"] is None
    assert f["packages"]["sglang"]["version"] == "0.5.11"  # found through site_packages, not the interpreter's path


def test_broken_torch_is_a_fact(sandbox, bare_python) -> None:
    host, torch_dir = bare_python
    torch_dir.mkdir(parents=True)
    (torch_dir / "__init__.py").write_text(
        "raise ImportError('libc10.so: cannot open shared object file: No such file or directory')\n")
    f = gather(host, refresh=True)
    assert f["torch"]["status"] == "broken"
    assert "libc10.so" in f["torch"]["error"]


def test_hanging_torch_import_is_killed(sandbox, bare_python) -> None:
    host, torch_dir = bare_python
    torch_dir.mkdir(parents=True)
    (torch_dir / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    with HostConnection(host) as conn:
        raw = conn.call("facts", "facts", site_packages=host.site_packages, release_root=host.release_root,
                        torch_timeout=2.0, refresh=True, timeout=60)
        assert raw["torch"]["status"] == "timeout"
        # the probe's process group was killed: nothing is left sleeping in the torch import
        left = conn.run("ps -eo args | grep -c '[v]env-facts-test/bin/python -c' || true").text().strip()
        assert left == "0"


def test_requires_dist_is_read_with_packaging_and_the_host_markers() -> None:
    from ddtree_deploy.facts import finish

    requires = ["torch==2.9.1; platform_machine == 'aarch64'", "torch (==2.11.0) ; platform_machine == \"x86_64\"",
                "triton>=3.4; extra == 'kernels'", "transformers<6,>=5.2; python_version >= '3.10'",
                "flashinfer-python==0.6.8; python_version < '3.9'", "not a requirement ;;"]
    raw = {"python": {"version": "3.11.7", "machine": "x86_64", "implementation": "cpython", "platform": "linux-x86_64"},
           "packages": {"sglang": {"version": "0.5.11", "requires": requires}, "torch": None}}
    info = finish(raw, "h")["packages"]["sglang"]
    # the marker decides (the old regex kept both torch pins, the last one winning); an extra pins nothing
    assert info["requires_torch"] == "==2.11.0"
    assert info["pins"] == {"torch": "==2.11.0", "transformers": "<6,>=5.2"}
    arm = finish({**raw, "python": {**raw["python"], "machine": "aarch64"}}, "h")["packages"]["sglang"]
    assert arm["requires_torch"] == "==2.9.1"
