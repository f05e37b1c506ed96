"""Fixtures of the spec-v2 patch-set tests: patched trees per base, built once per session."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from once import built_once  # noqa: E402
from v2_helpers import BASES, build_patched, cpu_scripts, run_scripts, script_result  # noqa: E402


@pytest.fixture(scope="session", params=BASES)
def v2_base(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def v2_trees(tmp_path_factory) -> dict:
    """base version -> its patched tree (built lazily, once per run: shared by the xdist workers, read-only)."""
    cache: dict = {}

    def get(version: str) -> Path:
        if version not in cache:
            cache[version] = built_once(tmp_path_factory, f"sglang-{version}-patched",
                                        lambda dest: build_patched(version, dest))
        return cache[version]

    return get


@pytest.fixture(scope="session")
def v2_tree(v2_base, v2_trees) -> Path:
    return v2_trees(v2_base)


@pytest.fixture(scope="session")
def v2_scripts_for(v2_trees, tmp_path_factory):
    """base version -> the results of its CPU scripts (v2_helpers.cpu_scripts: the probe, the plugin check, the
    FlashInfer metadata, the hybrid refusals), all in one subprocess per base and once per run: shared by every test
    file and xdist worker through a results file (a parametrized session fixture would run them again in each file
    that walks the bases)."""
    cache: dict = {}

    def get(version: str) -> dict:
        if version not in cache:
            def build(dest: Path) -> None:
                dest.mkdir(parents=True)
                results = run_scripts(v2_trees(version), dest, cpu_scripts(version))
                (dest / "results.json").write_text(json.dumps(results))
            done = built_once(tmp_path_factory, f"sglang-{version}-cpu-scripts", build)
            cache[version] = json.loads((done / "results.json").read_text())
        return cache[version]

    return get


@pytest.fixture(scope="session")
def v2_scripts(v2_base, v2_scripts_for) -> dict:
    """The per-base CPU scripts' results for the base under test."""
    return v2_scripts_for(v2_base)


@pytest.fixture(scope="session")
def v2_probe(v2_scripts) -> dict:
    """The per-base probe (imports + the glue against the base's classes)."""
    return script_result(v2_scripts, "probe")
