"""The spec-v2 series on the real SGLang wheels: applies through the product, compiles, imports on CPU, listed."""
from __future__ import annotations

import json
import py_compile
from pathlib import Path

import pytest
import yaml
from cli_inproc import run_cli
from v2_helpers import BASES, PROBE_MODULES, REPO, TRAITS, pinned

from ddtree_deploy.deploy import DEFAULT_PATCHSET
from ddtree_deploy.errors import PatchDoesNotApply
from ddtree_deploy.patchset.format import find_patchset_for

GLUE = ["config", "draft_topk", "round", "sampling", "verify_input", "compat"]


def test_series_applies_and_every_file_compiles(v2_base: str, v2_tree: Path, tmp_path: Path):
    meta = yaml.safe_load((REPO / "patches" / "ddtree" / f"sglang-{v2_base}" / "patchset.yaml").read_text())
    overlay = json.loads((v2_tree / "overlay.json").read_text())
    assert overlay["base_version"] == v2_base
    files = set(overlay["files"])
    assert set(meta["base"]["files"]) <= files, "every base file the series touches is replaced by the overlay"
    assert {f"sglang/srt/speculative/ddtree_v2/{m}.py" for m in GLUE} <= files
    assert "sglang/srt/speculative/ddtree/__init__.py" in files
    for i, path in enumerate(sorted(p for p in files if p.endswith(".py"))):
        py_compile.compile(str(v2_tree / path), cfile=str(tmp_path / f"{i}.pyc"), doraise=True)


def test_patched_modules_import_on_cpu(v2_base: str, v2_tree: Path, v2_probe: dict):
    assert v2_probe["imported"] == len(PROBE_MODULES)
    assert v2_probe["transformers"] == pinned(v2_base, "transformers"), "imported with the transformers it pins"
    worker = (v2_tree / "sglang/srt/speculative/dflash_worker_v2.py").read_text()
    traits = TRAITS[v2_base]
    assert "self._ddtree.finish_round(" in worker and "self._ddtree.check_target(" in worker
    assert ("self._ddtree.draft_builder(" in worker) == traits.tree_in_graph
    copies = "ddtree_config.draft_server_args(server_args)" in worker or "set_draft_width(draft_server_args)" in worker
    assert copies == (traits.draft_width == "copy"), "the draft worker is built from a copy at the block size"
    table = json.loads((v2_tree / "sglang/srt/speculative/ddtree_v2/plugin_hooks.json").read_text())
    hooked = {h["target"].rsplit(".", 1)[1] for h in table["hooks"]}
    assert ("get_num_tokens_per_req_for_target_verify" in hooked) == (traits.draft_width == "hook")


def test_patchset_list_shows_the_spec_v2_bases(v2_base: str):
    r = run_cli("patchset", "list", "--json", "--patches", str(REPO / "patches"), cwd=REPO)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    row = rows[f"ddtree/sglang-{v2_base}"]
    assert row["ok"] and row["base"] == f"sglang {v2_base}" and row["runtime_files"] > 20


def test_apply_picks_the_series_by_the_installed_version():
    """`apply` resolves the patch set from the host's installed sglang (deploy.plan -> find_patchset_for with the
    default name): every spec-v2 base gets its own folder, and a version without one names the bases there are."""

    assert {d.name.split("-", 1)[1] for d in (REPO / "patches" / "ddtree").glob("sglang-*")} == {"0.5.11", *BASES}, \
        "every spec-v2 series folder has its traits (the table spec-v2/bases.py reads)"
    for version in BASES:
        ps = find_patchset_for(DEFAULT_PATCHSET, version, root=REPO / "patches")
        assert ps.qualified_name == f"ddtree/sglang-{version}" and ps.base_version == version
        assert [v.dest for v in ps.vendored] == ["sglang/srt/speculative/ddtree", "sglang/srt/speculative/ddtree_v2"]
        assert [v.source.name for v in ps.vendored] == ["runtime", "spec-v2"], "one shared runtime and glue"
    with pytest.raises(PatchDoesNotApply) as err:
        find_patchset_for(DEFAULT_PATCHSET, "0.5.13", root=REPO / "patches")
    assert all(v in str(err.value) for v in ("0.5.11", *BASES))
