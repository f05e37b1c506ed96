"""The DDTree series against the real sglang 0.5.11 wheel: hashes, fuzz-0 application, byte-compilation."""
from __future__ import annotations

import py_compile
import subprocess
import zipfile
from pathlib import Path

import pytest

from sglang_series_helpers import PSET, patchset, sha256, touched, unpack


def test_patchset_metadata_is_complete():
    meta = patchset()
    assert meta["name"] == "ddtree"
    assert meta["base"] == {**meta["base"], "package": "sglang", "version": "0.5.11"}
    for p in meta["series"]:
        assert (PSET / p).is_file(), p
    # every base file the series modifies has a recorded hash, and nothing else does
    modified, created = set(), set()
    for p in meta["series"]:
        text = (PSET / p).read_text()
        for block in text.split("diff --git a/")[1:]:
            path = block.split(" b/", 1)[1].splitlines()[0]
            if "\nnew file mode" in block.split("\n---", 1)[0]:
                created.add(path)
            elif path not in created:
                modified.add(path)
    assert modified == set(meta["base"]["files"])
    assert (PSET / meta["runtime"]["source"] / "__init__.py").is_file()


def test_base_hashes_match_the_wheel(base_wheel: Path):
    meta = patchset()
    with zipfile.ZipFile(base_wheel) as zf:
        for path, want in meta["base"]["files"].items():
            assert sha256(zf.read(path)) == want, path


def test_series_applies_in_order_with_fuzz_0(base_wheel: Path, tmp_path: Path):
    meta = patchset()
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    unpack(base_wheel, tmp_path, only=files)
    for p in meta["series"]:
        # --check first: nothing is written when a patch does not apply
        subprocess.run(["git", "apply", "-p1", "--check", str(PSET / p)], cwd=tmp_path, check=True)
        subprocess.run(["git", "apply", "-p1", str(PSET / p)], cwd=tmp_path, check=True)
    # applying the series a second time must fail (it is not idempotent): proves the hunks really landed
    r = subprocess.run(["git", "apply", "-p1", "--check", str(PSET / meta["series"][0])], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode != 0
    text = (tmp_path / "sglang/srt/server_args.py").read_text()
    assert "speculative_ddtree_budget: Optional[int] = None" in text
    assert '"--speculative-ddtree-budget"' in text


def test_series_refuses_a_drifted_base(base_wheel: Path, tmp_path: Path):
    unpack(base_wheel, tmp_path, only=["sglang/srt/server_args.py"])
    f = tmp_path / "sglang/srt/server_args.py"
    f.write_text(f.read_text().replace("speculative_dflash_draft_window_size: Optional[int] = None",
                                       "speculative_dflash_draft_window_size: Optional[int] = 0"))
    r = subprocess.run(["git", "apply", "-p1", "--check", "--include=sglang/srt/server_args.py",
                        str(PSET / "0001-dispatch.patch")], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and "server_args.py" in r.stderr


def test_patched_modules_byte_compile(patched_tree: Path):
    meta = patchset()
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    runtime_files = sorted((patched_tree / meta["runtime"]["dest"]).rglob("*.py"))
    assert runtime_files
    for f in [patched_tree / f for f in files] + runtime_files:
        py_compile.compile(str(f), doraise=True, cfile=str(f) + ".check.pyc")


@pytest.mark.parametrize("upto", [1, 2])
def test_each_prefix_of_the_series_byte_compiles(base_wheel: Path, tmp_path: Path, upto: int):
    """The series is applied patch by patch; every intermediate state must still be valid Python."""
    meta = patchset()
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    unpack(base_wheel, tmp_path, only=files)
    for p in meta["series"][:upto]:
        subprocess.run(["git", "apply", "-p1", str(PSET / p)], cwd=tmp_path, check=True)
    for f in files:
        if (tmp_path / f).exists():
            py_compile.compile(str(tmp_path / f), doraise=True, cfile=str(tmp_path / f) + ".c.pyc")
