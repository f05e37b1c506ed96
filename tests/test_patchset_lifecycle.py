"""Patch lifecycle metadata on the real sglang 0.5.23 wheel: a series entry's ``applies_to`` / ``superseded_by`` /
``upstream_merged``, and a patch already in the base (reverse-applies cleanly) reported as a skip, not a failure.

The version gate both ways: a patch capped below the base with nothing saying where its change went is refused
(exit 5, nothing produced); a capped-out patch that names its successor or the upstream release is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_inproc import run_cli

from ddtree_deploy.errors import EXIT_PATCH, InputError
from ddtree_deploy.patchset import SeriesDoesNotApply, WheelBase, apply_patchset, load_patchset
from ddtree_deploy.patchset.base import BaseSource
from ddtree_deploy.patchset.dev import series_entries, update_yaml_text
from ddtree_deploy.patchset.lifecycle import gate
from ddtree_deploy.wheels import fetch_wheel

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "tests" / "patchsets" / "sample"
P1 = "0001-spec-registry-add-is-ddtree-to-plugin-algorithms.patch"
P2 = "0002-device-config-ddtree-devices-and-a-sample-hook-modul.patch"
REGISTRY = "sglang/srt/speculative/spec_registry.py"


@pytest.fixture(scope="module")
def wheel_023() -> WheelBase:
    return WheelBase(fetch_wheel("sglang", "0.5.23"))


def sample_with(tmp_path: Path, first: str) -> Path:
    """A copy of the sample patch set whose first series entry is the YAML text ``first``."""
    root = tmp_path / "patches"
    shutil.copytree(SAMPLE, root / "sample")
    y = root / "sample" / "sglang-0.5.23" / "patchset.yaml"
    y.write_text(y.read_text().replace(f"  - {P1}\n", f"  - {first}\n"))
    return y


def test_a_patch_capped_below_the_base_is_refused(wheel_023: WheelBase, tmp_path: Path) -> None:
    y = sample_with(tmp_path, f'{{patch: {P1}, applies_to: "<0.5.20"}}')
    ps = load_patchset(y)
    assert ps.patches[0].applies_to == "<0.5.20"
    with pytest.raises(SeriesDoesNotApply) as err:
        apply_patchset(ps, wheel_023)
    assert f"{P1} applies to sglang <0.5.20 only, and this base is 0.5.23" in err.value.message
    assert err.value.details["reason"] == "applies_to" and err.value.exit_code == EXIT_PATCH
    r = run_cli("patchset", "check", str(y), "--base", str(fetch_wheel("sglang", "0.5.23")), "--json", cwd=REPO,
                env=dict(os.environ))
    assert r.returncode == EXIT_PATCH and "applies to sglang <0.5.20 only" in json.loads(r.stdout)["error"]


@pytest.mark.parametrize("entry, why", [
    (f'{{patch: {P1}, applies_to: "<0.5.20", upstream_merged: "0.5.21"}}', "in sglang since 0.5.21"),
    (f'{{patch: {P1}, applies_to: "<0.5.20", superseded_by: {P2}}}', f"superseded by {P2} on 0.5.23"),
    (f'{{patch: {P1}, applies_to: ">=0.5.30"}}', "not needed on 0.5.23"),
    (f'{{patch: {P1}, upstream_merged: "0.5.23"}}', "in sglang since 0.5.23"),
])
def test_a_capped_out_patch_is_skipped(wheel_023: WheelBase, tmp_path: Path, entry: str, why: str) -> None:
    result = apply_patchset(load_patchset(sample_with(tmp_path, entry)), wheel_023)
    assert [s.status for s in result.steps] == ["skipped", "applied"]
    assert why in result.steps[0].detail
    assert any(n.startswith(f"{P1} skipped: ") for n in result.overlay.notes)
    assert REGISTRY not in {f.path for f in result.overlay.files}, "the skipped patch changed nothing"
    plain = apply_patchset(load_patchset(SAMPLE / "sglang-0.5.23"), wheel_023)
    assert REGISTRY in {f.path for f in plain.overlay.files}


def test_gate_applies_inside_the_range(tmp_path: Path) -> None:
    p = load_patchset(sample_with(tmp_path, f'{{patch: {P1}, applies_to: ">=0.5.14,<0.5.24"}}')).patches[0]
    assert gate(p, "sglang", "0.5.23") == ("apply", "")
    assert gate(p, "sglang", "0.5.24")[0] == "refuse" and gate(p, "sglang", "0.5.11")[0] == "skip"


class MergedBase(BaseSource):
    """The real 0.5.23 wheel with one file as it is once upstream has merged the first patch's change."""

    def __init__(self, wheel: WheelBase, path: str, content: bytes) -> None:
        self.wheel, self.path, self.content = wheel, path, content
        self.package, self.version, self.label = wheel.package, wheel.version, "wheel 0.5.23 + merged change"

    def list_files(self) -> list[str]:
        return self.wheel.list_files()

    def read(self, path: str) -> bytes:
        return self.content if path == self.path else self.wheel.read(path)

    def mode(self, path: str) -> int:
        return self.wheel.mode(path)


def test_a_patch_already_in_the_base_is_a_skip(wheel_023: WheelBase) -> None:
    ps = load_patchset(SAMPLE / "sglang-0.5.23")
    first = apply_patchset(ps, wheel_023).overlay
    merged = MergedBase(wheel_023, REGISTRY, next(f.content for f in first.files if f.path == REGISTRY))
    result = apply_patchset(ps, merged, allow_base_drift=True)  # its hash is no longer the base's: drift
    assert [s.status for s in result.steps] == ["present", "applied"]
    assert "reverse-applies cleanly" in result.steps[0].detail
    assert REGISTRY not in {f.path for f in result.overlay.files}


@pytest.mark.parametrize("entry, words", [
    (f"{{patch: {P1}, applies: x}}", ["series[0]", "unknown field 'applies'"]),
    (f'{{patch: {P1}, applies_to: "newer"}}', ["series[0]", "not a version specifier"]),
    (f'{{patch: {P1}, upstream_merged: "soon"}}', ["series[0]", "not a version"]),
    (f"{{patch: {P1}, superseded_by: 0009-none.patch}}", ["series[0].superseded_by", "not in the series"]),
    ("{applies_to: '<1'}", ["series[0]", "a mapping with 'patch'"]),
])
def test_bad_lifecycle_fields_name_the_field(tmp_path: Path, entry: str, words: list[str]) -> None:
    with pytest.raises(InputError) as err:
        load_patchset(sample_with(tmp_path, entry))
    for w in words:
        assert w in str(err.value), str(err.value)


def test_refresh_keeps_an_entrys_lifecycle_fields(tmp_path: Path) -> None:
    y = sample_with(tmp_path, f'{{patch: {P1}, applies_to: "<0.5.30", upstream_merged: "0.5.30"}}')
    ps = load_patchset(y)
    text, kept = update_yaml_text(y.read_text(), series=series_entries(ps, [P1, P2]), base_files=ps.base_files)
    assert kept and text == y.read_text()
