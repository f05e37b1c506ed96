"""CPU checks of how the GPU tests find their SGLang (tests/gpu/sglang_on_path.py): nothing under tests/ is
importable as ``sglang``, and ``pytest -m gpu`` on the two hybrid GPU files (with torch made to report a GPU) skips
each with its reason instead of erroring, whether no sglang, another base or a stock package is on the path.
Not marked ``gpu``: these run in the CPU suite; they compute nothing on a device."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "sglang_v2"))
from sglang_on_path import MARKERS, skip_reason  # noqa: E402
from v2_helpers import FAKE_CUDA  # noqa: E402

BASE_FILE = "tests/gpu/test_hybrid_base_kernels_gpu.py"
V2_FILE = "tests/gpu/test_hybrid_v2_kernels_gpu.py"


def fake_bundle(root: Path, version: str, *, overlay: bool, dist_info: bool = False) -> Path:
    """A regular ``sglang`` package of ``version`` (with the DDTree overlay's marker file of that base if asked); with
    ``dist_info``, laid out as the real wheels are: ``version.py`` holds a placeholder and the version is the
    dist-info's."""
    d = root / "sglang"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("")
    (d / "version.py").write_text(f'__version__ = "{"0.0.0.dev0" if dist_info else version}"\n')
    if dist_info:
        meta = root / f"sglang-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    if overlay:
        (d / MARKERS[version]).parent.mkdir(parents=True, exist_ok=True)
        (d / MARKERS[version]).write_text("")
    return root


def pytest_gpu(tmp_path: Path, pythonpath: list[Path], *files: str) -> tuple[int, dict[str, str]]:
    """``pytest -m gpu FILES`` with a fake sm90 GPU; (exit status, {test id: skip reason})."""
    cuda = tmp_path / "cuda"
    cuda.mkdir(parents=True, exist_ok=True)
    (cuda / "sitecustomize.py").write_text(FAKE_CUDA)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [cuda, *pythonpath])), "TRITON_INTERPRET": "0"}
    env.pop("DDTREE_ALLOW_SKIPS", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-m", "gpu", *files],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    skips = dict(re.findall(r"^SKIPPED \[\d+\] ([^:]+:\d+): (.*)$", r.stdout, re.M))
    assert "error" not in r.stdout.splitlines()[-1], r.stdout[-3000:]
    return r.returncode, skips


def test_nothing_under_tests_is_importable_as_sglang():
    assert not [p for p in (ROOT / "tests").rglob("sglang") if p.is_dir()], "a folder named sglang shadows SGLang"
    code = "import sys; sys.path[:0] = sys.argv[1:]; from sglang_on_path import sglang_dir; print(sglang_dir())"
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "gpu"), str(ROOT / "tests"), str(ROOT)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert r.stdout.strip() == "None", r.stdout + r.stderr


def test_a_namespace_folder_is_not_sglang(tmp_path: Path):
    (tmp_path / "ns" / "sglang").mkdir(parents=True)  # a bare folder, as tests/sglang/ was
    code = "import sys; sys.path[:0] = sys.argv[1:]; from sglang_on_path import skip_reason; print(skip_reason('0.5.17'))"
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "gpu"), str(tmp_path / "ns")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert r.stdout.startswith("no sglang importable"), r.stdout + r.stderr


def test_gpu_files_skip_with_their_reason(tmp_path: Path):
    rc, skips = pytest_gpu(tmp_path / "none", [], BASE_FILE, V2_FILE)
    assert rc == 0 and skips, skips  # skips the suite allows (tests/conftest.py ALLOWED_SKIPS), no errors
    assert all(v.startswith("no sglang importable") for v in skips.values()), skips
    assert any(k.startswith(BASE_FILE) for k in skips) and any(k.startswith(V2_FILE) for k in skips)

    bundle17 = fake_bundle(tmp_path / "b17", "0.5.17", overlay=True)
    rc, skips = pytest_gpu(tmp_path / "b17run", [bundle17], BASE_FILE)
    assert rc == 0 and skips and all("needs the offline bundle of SGLang 0.5.11" in v and "is 0.5.17" in v
                                     for v in skips.values()), skips

    stock17 = fake_bundle(tmp_path / "s17", "0.5.17", overlay=False)
    rc, skips = pytest_gpu(tmp_path / "s17run", [stock17], V2_FILE)
    assert rc == 0 and len(skips) == 1 and "has no srt/speculative/ddtree_v2/hybrid.py" in next(iter(skips.values()))


def test_the_right_bundle_is_found(tmp_path: Path):
    bundle = fake_bundle(tmp_path, "0.5.17", overlay=True)
    sys.path.insert(0, str(bundle))
    try:
        assert skip_reason("0.5.17") is None
        assert "needs the offline bundle of SGLang 0.5.11" in skip_reason("0.5.11")
    finally:
        sys.path.remove(str(bundle))


def test_the_version_comes_from_the_dist_info_as_on_the_h200(tmp_path: Path):
    """The 0.5.17 wheel's version.py says 0.0.0.dev0; the bundle's SGLang is 0.5.17 by its dist-info (on the H200
    the kernel check skipped, taking the placeholder for the version)."""
    bundle = fake_bundle(tmp_path / "w17", "0.5.17", overlay=True, dist_info=True)
    code = ("import sys; sys.path[:0] = sys.argv[1:]; from sglang_on_path import skip_reason, sglang_dir, sglang_version; "
            "print(sglang_version(sglang_dir()), skip_reason('0.5.17'))")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "gpu"), str(bundle)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert r.stdout.split() == ["0.5.17", "None"], r.stdout + r.stderr
