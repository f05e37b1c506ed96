"""What a base's own folder says about it besides the series: ``traits:`` (the table spec-v2's ``bases.py`` reads,
generated into the overlay) and ``stack:`` (what its wheel pins, for the ABI check), validated with errors naming
the file and the field; and what ``patchset port`` does with them. No wheel is needed: the overlay's generated table
is read by the real ``bases.py`` imported as the package the overlay makes of it.
"""
from __future__ import annotations

import importlib
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import spec_v2_tables
from packaging.version import Version

from ddtree_deploy.errors import EXIT_USAGE, InputError
from ddtree_deploy.patchset import load_patchset
from ddtree_deploy.patchset.port import _new_yaml, pinned_stack
from ddtree_deploy.patchset.traits import family_traits, traits_files

REPO = Path(__file__).resolve().parent.parent
DDTREE = REPO / "patches" / "ddtree"
TABLE = "sglang/srt/speculative/ddtree_v2/bases.json"
bases = spec_v2_tables.load("bases")


def _spec_v2_folders() -> list[str]:
    """The spec-v2 bases with a folder, oldest first."""
    return sorted((p.parent.name.split("-", 1)[1] for p in DDTREE.glob("sglang-*/patchset.yaml")
                   if "../spec-v2" in p.read_text()), key=Version)


def test_every_spec_v2_base_has_its_traits_in_its_folder():
    rows = family_traits(DDTREE, TABLE)
    assert list(rows) == _spec_v2_folders(), "every spec-v2 folder, oldest first"
    table = bases.table(rows, str(DDTREE))  # every row of the kinds bases.py reads
    assert table["0.5.14"] == bases.Base(draft_width="copy", tree_in_graph=False, grammar=False, schedule=False,
                                         hybrid=False, flashinfer=True, meta_info=False)
    assert bases.with_trait("hybrid", table)[0] == "0.5.17" and bases.with_trait("flashinfer", table)[-1] == "0.5.21"
    assert bases.with_trait("meta_info", table)[0] == "0.5.15", "0.5.14's output streamer: /metrics only"
    assert "0.5.11" not in family_traits(DDTREE), "0.5.11 (spec-v1) has no traits"


def test_the_overlay_carries_every_bases_traits_and_bases_py_reads_them(tmp_path: Path):
    """``patchset build``'s generated table, beside the real bases.py in a package as the overlay lays it out."""
    ps = load_patchset(DDTREE / "sglang-0.5.22")
    [generated] = traits_files(ps)
    assert generated.path == TABLE and generated.action == "add"
    data = json.loads(generated.content)
    assert data["format"] == bases.TABLE_FORMAT and data["patchset"] == "ddtree"
    assert data["bases"] == family_traits(DDTREE, TABLE)
    pkg = tmp_path / "ddtree_v2_overlay_t"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copyfile(DDTREE / "spec-v2" / "bases.py", pkg / "bases.py")
    (pkg / "bases.json").write_bytes(generated.content)
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("ddtree_v2_overlay_t.bases")
        as_dicts = lambda table: {v: asdict(b) for v, b in table.items()}  # noqa: E731 (two loads, two classes)
        assert as_dicts(mod.BASES) == as_dicts(spec_v2_tables.bases_table())
        assert list(mod.BASES) == _spec_v2_folders(), "every base, oldest first"
        assert mod.with_trait("schedule") == tuple(v for v in mod.BASES if Version(v) >= Version("0.5.17"))
        assert not mod.BASES["0.5.22"].flashinfer and mod.BASES["0.5.21"].flashinfer
        (pkg / "bases.json").write_text(json.dumps({**data, "format": 2}))
        with pytest.raises(ValueError, match=r"bases.json: not a bases table of format 1"):
            mod.read(pkg / "bases.json")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("ddtree_v2_overlay_t")]:
            del sys.modules[name]


@pytest.mark.parametrize("row,message", [
    ({"hybird": True}, "base 0.5.99: unknown trait 'hybird'"),
    ({"hybrid": None}, "base 0.5.99: trait 'hybrid' missing"),
    ({"draft_width": "both"}, "trait 'draft_width' is 'both', expected 'hook' or 'copy'"),
    ({"grammar": "yes"}, "trait 'grammar' is 'yes', expected true or false"),
])
def test_bases_py_refuses_a_row_it_cannot_read(row: dict, message: str):
    good = dict(family_traits(DDTREE, TABLE)["0.5.23"])
    bad = {k: v for k, v in {**good, **row}.items() if v is not None}
    with pytest.raises(ValueError) as err:
        bases.table({"0.5.99": bad}, "t.json")
    assert str(err.value).startswith("t.json: ") and message in str(err.value)


def _family(tmp_path: Path, *versions: str) -> Path:
    """A copy of patches/ddtree with the shared folders and the given bases."""
    fam = tmp_path / "ddtree"
    for name in ("runtime", "spec-v2", *(f"sglang-{v}" for v in versions)):
        shutil.copytree(DDTREE / name, fam / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return fam


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_trait_out_of_line_in_one_base_is_named_with_its_file(tmp_path: Path):
    fam = _family(tmp_path, "0.5.21", "0.5.22", "0.5.23")
    odd = fam / "sglang-0.5.22" / "patchset.yaml"
    _edit(odd, "  hybrid: true\n", "  hybird: true\n")
    with pytest.raises(InputError) as err:
        family_traits(fam, TABLE)
    assert str(err.value).startswith(f"{odd}: field 'traits.hybird': no other base of ddtree has this trait")
    _edit(odd, "  hybird: true\n", "")
    with pytest.raises(InputError) as err:
        family_traits(fam, TABLE)
    assert str(err.value).startswith(f"{odd}: field 'traits': missing 'hybrid', which the other bases of ddtree have")
    # the build refuses it the same way: the overlay of any base of the family carries the whole table
    with pytest.raises(InputError, match="missing 'hybrid'"):
        traits_files(load_patchset(fam / "sglang-0.5.23"))


@pytest.mark.parametrize("old,new,message", [
    ("  hybrid: true\n", "  hybrid: [true]\n", "field 'traits': trait 'hybrid': expected true / false"),
    ("  hybrid: true\n", "  Hybrid: true\n", "field 'traits': trait 'Hybrid' is not a lower-case identifier"),
    ('  python: "3.11"', "  python: 3.11  ", "field 'stack.python': expected a string"),
    ('  python: "3.11"', '  python: "3"   ', "field 'stack.python': expected a Python release such as '3.11'"),
    ("  cuda: 13  ", '  cuda: "13"', "field 'stack.cuda': expected an integer"),
    ('  kernel: "0.4.10"', '  kernel: "new"   ', "field 'stack.kernel': expected a version"),
    ('  flashinfer: "0.7.2"', '  # flashinfer: "0.7.2"', "missing required field 'stack.flashinfer'"),
    ("traits_file: sglang/srt/speculative/ddtree_v2/bases.json", "traits_file: sglang/srt/speculative/ddtree_v2/b.txt",
     "field 'traits_file': 'sglang/srt/speculative/ddtree_v2/b.txt' must be a .json file"),
    ("traits_file: sglang/srt/speculative/ddtree_v2/bases.json",
     "traits_file: sglang/srt/speculative/ddtree_v2/plugin_hooks.json", "is also vendored, patched or the hook table"),
    ("traits_file: sglang/srt/speculative/ddtree_v2/bases.json", "traits_file: sglang/srt/speculative/ddtree_v2/bases.py",
     "must be a .json file"),
    ("traits_file: sglang/srt/speculative/ddtree_v2/bases.json", "traits_file: ../bases.json", "field 'traits_file'"),
])
def test_a_malformed_traits_or_stack_is_refused_naming_file_and_field(tmp_path: Path, old: str, new: str,
                                                                       message: str):
    fam = _family(tmp_path, "0.5.23")
    yml = fam / "sglang-0.5.23" / "patchset.yaml"
    _edit(yml, old, new)
    with pytest.raises(InputError) as err:
        load_patchset(yml)
    assert err.value.exit_code == EXIT_USAGE
    assert str(yml) in str(err.value) and message in str(err.value), str(err.value)


def test_a_traits_file_needs_traits(tmp_path: Path):
    fam = _family(tmp_path, "0.5.23")
    yml = fam / "sglang-0.5.23" / "patchset.yaml"
    text = yml.read_text()
    start, end = text.index("traits:"), text.index("traits_file:")
    yml.write_text(text[:start] + text[end:])
    with pytest.raises(InputError) as err:
        load_patchset(yml)
    assert str(err.value) == (f"{yml}: field 'traits_file': the patch set has no traits to write there; add 'traits' "
                              "or drop 'traits_file'")


METADATA = """Metadata-Version: 2.1
Name: sglang
Version: 0.5.24
Requires-Python: >=3.11
Requires-Dist: flashinfer_python[cu13]==0.7.3
Requires-Dist: sglang-kernel==0.4.11
Requires-Dist: torch==2.15.0
Requires-Dist: torch==2.14.0; extra == "old"
Requires-Dist: torchaudio==2.15.0
"""


def test_port_reads_the_stack_from_the_new_wheels_metadata():
    assert pinned_stack(METADATA) == {"torch": "2.15.0", "kernel": "0.4.11", "flashinfer": "0.7.3", "python": "3.11"}
    assert pinned_stack(METADATA.replace("Requires-Dist: sglang-kernel==0.4.11\n", "")) is None, "one pin missing"
    assert pinned_stack(METADATA.replace("Requires-Python: >=3.11\n", "")) is None, "no Python floor"


def test_port_rewrites_the_stack_keeping_comments_and_the_cuda_line():
    ps = load_patchset(DDTREE / "sglang-0.5.23")
    text = _new_yaml(ps, "0.5.24", ps.series, ps.base_files, dict(ps.requires), pinned_stack(METADATA))
    old = (DDTREE / "sglang-0.5.23" / "patchset.yaml").read_text()
    stack = text.split("\nstack:", 1)[1].split("\ntraits:", 1)[0]
    assert stack == old.split("\nstack:", 1)[1].split("\ntraits:", 1)[0].replace(
        '"2.14.1"', '"2.15.0"').replace('"0.4.10"', '"0.4.11"').replace('"0.7.2"  ', '"0.7.3"  ')
    assert old.split("\ntraits:", 1)[1].split("\nrequires:", 1)[0] in text, "the traits are copied as they are"
    dropped = _new_yaml(ps, "0.5.24", ps.series, ps.base_files, dict(ps.requires), None)
    assert "\nstack:" not in dropped and "cuda:" not in dropped and "\ntraits:" in dropped
