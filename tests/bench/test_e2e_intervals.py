"""bench/e2e/intervals.py: pooled tok/s, bootstrap ratio intervals and the target verdict, on result files laid out
as the e2e driver writes them (a folder and a tarball of it)."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bench.e2e import intervals


def _runs(seconds: list[float], tokens: int = 64, rounds: int = 63) -> list[dict]:
    return [{"seconds": s, "tokens": tokens, "rounds": rounds, "tok_per_s": round(tokens / s, 1), "meta": []}
            for s in seconds]


def _write(folder: Path, name: str, cells: dict[int, list[dict]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(
        {"config": {"name": name}, "ok": True, "workloads": {f"speed-bs{b}": r for b, r in cells.items()}}))


def test_pooled_tok_s_is_total_tokens_over_total_time():
    runs = _runs([1.0, 3.0])
    assert intervals.pooled_tok_s(runs) == pytest.approx(128 / 4.0)  # not the mean of 64 and 21.3


def test_the_interval_holds_the_ratio_and_narrows_with_less_noise():
    rng = np.random.default_rng(1)
    chain = _runs(list(1.0 + 0.05 * rng.standard_normal(8)))
    slower = _runs(list(1.2 + 0.05 * rng.standard_normal(8)))
    iv = intervals.ratio_interval(slower, chain)
    assert iv["ci_low"] <= iv["ratio"] <= iv["ci_high"] and iv["ci_high"] < 1.0
    assert iv["cost_low"] <= iv["cost"] <= iv["cost_high"] and iv["cost_low"] > 1.0
    assert iv["cost"] == pytest.approx(1 / iv["ratio"])  # same tokens and rounds per rep: the inverse
    tight = intervals.ratio_interval(_runs([1.2] * 8), _runs([1.0] * 8))
    assert tight["ci_low"] == tight["ci_high"] == pytest.approx(1 / 1.2)
    assert iv["ci_high"] - iv["ci_low"] > 0.01
    again = intervals.ratio_interval(slower, chain)
    assert again == iv  # seeded


def test_rows_from_a_tarball_and_a_folder_judge_the_target_at_the_upper_end(tmp_path: Path):
    a = tmp_path / "a"
    _write(a, "chain", {1: _runs([1.0, 1.02, 0.98, 1.0]), 8: _runs([2.0] * 4, tokens=512)})
    _write(a, "tree", {1: _runs([1.02, 1.03, 1.01, 1.02]), 8: _runs([2.5] * 4, tokens=512)})
    tgz = tmp_path / "a-raw.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(a, arcname=".")
    b = tmp_path / "b"
    _write(b, "wide", {1: _runs([1.5] * 4)})
    rc = intervals.main([str(tmp_path / "out"), str(tgz), str(b), "--ref", "chain", "--configs", "tree,wide,gone",
                         "--target-max", "1.05"])
    assert rc == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    rows = {(r["config"], r.get("batch")): r for r in doc["rows"]}
    assert rows[("tree", 1)]["reps"] == 4 and rows[("tree", 1)]["round_cost_ci_high"] <= 1.05
    assert rows[("tree", 1)]["met"] is True
    assert rows[("tree", 8)]["round_cost_vs_ref"] == pytest.approx(1.25) and rows[("tree", 8)]["met"] is False
    assert rows[("wide", 1)]["ratio_vs_ref"] == pytest.approx(1.0 / 1.5, rel=1e-3)
    assert "missing" in rows[("gone", None)]
    md = (tmp_path / "out.md").read_text()
    assert "| tree | 8 | 4 |" in md and "no |" in md


def test_an_unknown_reference_is_refused_naming_what_was_found(tmp_path: Path):
    _write(tmp_path / "r", "chain", {1: _runs([1.0])})
    with pytest.raises(SystemExit) as err:
        intervals.main([str(tmp_path / "o"), str(tmp_path / "r"), "--ref", "chian"])
    assert "chian" in str(err.value) and "chain" in str(err.value)
