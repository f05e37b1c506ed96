"""``ddtree_deploy.plot``: the figures ``bench --plot`` and ``tune --plot`` write, drawn by the real matplotlib, and
the checks that run before anything is measured (the sandbox CLI tests in tests/cli/test_cli_tune.py draw them
from real measurements)."""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ddtree_deploy import plot
from ddtree_deploy.errors import EXIT_USAGE, InputError

pytest.importorskip("matplotlib")
SVG = "{http://www.w3.org/2000/svg}"


def _cell(config: str, batch: int, tok_s: float, budget: str | None = None) -> dict:
    return {"config": config, "budget": budget, "batch": batch, "tok_s": tok_s, "tok_s_min": tok_s * 0.9,
            "tok_s_max": tok_s * 1.1, "reps": 3}


def _texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # well-formed SVG
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def test_bench_figure_has_a_line_per_config_and_the_batch_sizes(tmp_path: Path) -> None:
    rows = [_cell(c, b, v * b) for c, v in (("ddtree", 210.0), ("chain", 160.0), ("plain", 100.0)) for b in (1, 8, 32)]
    res = {"host": "gpu1", "release": "r7", "rows": rows}
    path = plot.bench_figure(res, tmp_path / "bench.svg")
    texts = _texts(path)
    for label in ("ddtree", "chain", "plain", "1", "8", "32", "requests in flight (batch size)"):
        assert label in texts, (label, texts)
    assert any("gpu1" in t and "r7" in t for t in texts)
    assert not list(tmp_path.glob(".*tmp*"))  # written under a temporary name, then renamed


def test_tune_figure_has_the_schedule_and_the_acceptance_by_depth(tmp_path: Path) -> None:
    ms = [_cell(c, b, v) for c, v in (("plain", 100.0), ("chain", 150.0), ("ddtree-16", 170.0), ("ddtree-64", 190.0))
          for b in (1, 8)]
    res = {"host": "gpu1", "release": "r7", "schedule": "1:64,8:16", "measurements": ms,
           "table": [{"batch": 1, "schedule_tok_s": 190.0}, {"batch": 8, "schedule_tok_s": 170.0}],
           "accept_profile": [[0.6, 0.2], [0.4, 0.1], [0.2, 0.05]]}
    texts = _texts(plot.tune_figure(res, tmp_path / "tune.svg"))
    for label in ("b16", "b64", "chain", "plain", "schedule 1:64,8:16", "draft depth"):
        assert label in texts, (label, texts)
    assert plot.acceptance_by_depth(res["accept_profile"]) == [0.8, 0.5, 0.25]
    res["fitted_schedule"] = "1:16"  # kept within noise: the table is the fit's, so is the label
    assert "schedule 1:16" in _texts(plot.tune_figure(res, tmp_path / "kept.svg"))


@pytest.mark.parametrize("suffix", [".png", ".pdf"])
def test_the_suffix_picks_the_format(tmp_path: Path, suffix: str) -> None:
    res = {"rows": [_cell("chain", 1, 100.0), _cell("plain", 1, 80.0)]}
    path = plot.bench_figure(res, tmp_path / f"b{suffix}")
    magic = {".png": b"\x89PNG", ".pdf": b"%PDF"}[suffix]
    assert path.read_bytes().startswith(magic)


def test_bad_targets_are_refused_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad, words in ((tmp_path / "fig.jpg", "suffix"), (tmp_path / "nope" / "fig.svg", "does not exist")):
        with pytest.raises(InputError, match=words) as exc:
            plot.check_target(bad)
        assert str(bad) in str(exc.value) and exc.value.exit_code == EXIT_USAGE
    (tmp_path / "d.svg").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        plot.check_target(tmp_path / "d.svg")
    assert plot.check_target(tmp_path / "ok.svg") == tmp_path / "ok.svg"
    assert not (tmp_path / "ok.svg").exists()  # the check writes nothing
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    with pytest.raises(InputError, match="needs matplotlib") as exc:
        plot.check_target(tmp_path / "ok.svg")
    assert exc.value.hint == plot.INSTALL
