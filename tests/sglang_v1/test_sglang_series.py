"""The DDTree series against the real sglang 0.5.11 wheel: hashes, fuzz-0 application, byte-compilation."""
from __future__ import annotations

import py_compile
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy.errors import PatchDoesNotApply
from ddtree_deploy.patchset.apply import SeriesDoesNotApply
from sglang_series_helpers import PSET, apply_series, patchset, sha256, touched, unpack_prefix


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
    # the series only wires SGLang's own files: DDTree's modules are vendored (the runtime, and spec-v1 beside
    # DFLASH's modules), none is created by a patch
    assert created == set()
    assert (PSET / meta["runtime"]["source"] / "__init__.py").is_file()
    assert meta["vendor"] == [{"source": "../spec-v1", "dest": "sglang/srt/speculative"}]
    assert {p.name for p in (PSET / "../spec-v1").glob("*.py")} >= {"ddtree_verify.py", "ddtree_info.py"}


def test_vendored_spec_v1_adds_files_only(base_wheel: Path):
    """spec-v1 lands in SGLang's own speculative/ folder: each of its files is new there (a vendored file that
    replaced one of SGLang's would be a patch without hashes), and the folder gains no __init__.py (it stays the
    base's namespace package)."""
    from ddtree_deploy.patchset.format import load_patchset

    ps = load_patchset(PSET / "patchset.yaml")
    spec_v1 = [v for v in ps.vendor if v.source.name == "spec-v1"]
    assert len(spec_v1) == 1
    dests = [dest for dest, _ in spec_v1[0].files]
    assert "sglang/srt/speculative/ddtree_info.py" in dests
    assert not any(d.endswith("__init__.py") for d in dests)
    with zipfile.ZipFile(base_wheel) as zf:
        assert set(dests).isdisjoint(zf.namelist())


def test_base_hashes_match_the_wheel(base_wheel: Path):
    meta = patchset()
    with zipfile.ZipFile(base_wheel) as zf:
        for path, want in meta["base"]["files"].items():
            assert sha256(zf.read(path)) == want, path


def test_series_applies_in_order_with_fuzz_0(base_wheel: Path):
    """The product's apply engine takes the series patch by patch, in order, with no fuzz; every base file the
    series modifies comes out changed (the hunks really landed)."""
    meta = patchset()
    result = apply_series(base_wheel)
    assert [(step.name, step.status) for step in result.steps] == [(p, "applied") for p in meta["series"]]
    files = {f.path: f.content for f in result.overlay.files}
    with zipfile.ZipFile(base_wheel) as zf:
        for path in meta["base"]["files"]:
            assert files[path] != zf.read(path), path
    text = files["sglang/srt/server_args.py"].decode()
    assert "speculative_ddtree_budget: Optional[int] = None" in text
    assert '"--speculative-ddtree-budget"' in text


def test_series_refuses_a_drifted_base(base_wheel: Path, tmp_path: Path):
    """A base whose server_args.py differs where 0001 lands is refused by its hash, and even with
    --allow-base-drift the hunk does not apply at fuzz 0: the error names the file."""
    drifted = tmp_path / base_wheel.name
    with zipfile.ZipFile(base_wheel) as src, zipfile.ZipFile(drifted, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "sglang/srt/server_args.py":
                data = data.replace(b"speculative_dflash_draft_window_size: Optional[int] = None",
                                    b"speculative_dflash_draft_window_size: Optional[int] = 0")
            dst.writestr(item, data)
    with pytest.raises(PatchDoesNotApply, match="server_args.py"):
        apply_series(drifted)
    with pytest.raises(SeriesDoesNotApply, match="server_args.py"):
        apply_series(drifted, allow_base_drift=True)


def test_patched_modules_byte_compile(patched_tree: Path):
    meta = patchset()
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    runtime_files = sorted((patched_tree / meta["runtime"]["dest"]).rglob("*.py"))
    vendored = [patched_tree / v["dest"] / p.name for v in meta["vendor"] for p in (PSET / v["source"]).glob("*.py")]
    assert runtime_files and vendored
    for f in [patched_tree / f for f in files] + runtime_files + vendored:
        py_compile.compile(str(f), doraise=True, cfile=str(f) + ".check.pyc")


@pytest.mark.parametrize("upto", [1, 2])
def test_each_prefix_of_the_series_byte_compiles(base_wheel: Path, tmp_path: Path, upto: int):
    """The series is applied patch by patch; every intermediate state must still be valid Python."""
    meta = patchset()
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    unpack_prefix(base_wheel, tmp_path, files, upto)
    for f in files:
        if (tmp_path / f).exists():
            py_compile.compile(str(tmp_path / f), doraise=True, cfile=str(tmp_path / f) + ".c.pyc")
