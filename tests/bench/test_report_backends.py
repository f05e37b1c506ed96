"""bench/e2e/reports/backends.py (the `backends` report of #28) on CPU: the lossless tables and the matrix from a real
dry run of gpu_run.sh (FlashInfer at page size 1, triton at page size 16), failed configurations kept as rows with
their error, and the round table's ratios against the chain of the same backend and page size on synthetic speed
results shaped like the driver's."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.e2e import driver, report

pytest.importorskip("scipy")  # the report imports chisq
ROOT = Path(__file__).resolve().parents[2]


def _write(d: Path, name: str, **fields) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps({"config": driver.parse(name), "workloads": {}, **fields}))


def _runs(round_ms: list[float], tokens: int = 64, accepted: int = 0) -> list[dict]:
    """Speed reps as driver.speed_workloads writes them (one request per call)."""
    out = []
    for rms in round_ms:
        rounds = tokens - 1 - accepted
        secs = rounds * rms / 1000
        out.append({"seconds": round(secs, 4), "short_seconds": round(secs / 4, 4), "prefill_seconds": 0.01,
                    "tokens": tokens, "tok_per_s": round(tokens / secs, 1), "rounds": rounds, "rounds_short": rounds // 4,
                    "round_ms": rms, "meta": [{"completion_tokens": tokens, "spec_verify_ct": rounds,
                                               "spec_accepted_drafts": accepted}]})
    return out


def _load(stem: Path) -> dict:
    return json.loads(stem.with_name(stem.name + ".json").read_text())


def test_rounds_against_the_chain_of_the_same_backend_and_failed_configs_keep_their_error(tmp_path: Path):
    speed = tmp_path / "speed"
    chain_fi, tree_fi, chain_tri = ([10.0, 10.2, 9.9, 10.1, 10.05], [12.0, 12.3, 11.9, 12.1, 12.2],
                                    [9.0, 9.1, 8.9, 9.05, 9.2])
    _write(speed, "q8b-chain-graph-fi", ok=True, workloads={"speed-bs1": _runs(chain_fi)})
    _write(speed, "q8b-ddtree-b16-graph-fi", ok=True, workloads={"speed-bs1": _runs(tree_fi)})
    _write(speed, "q8b-chain-graph", ok=True, workloads={"speed-bs1": _runs(chain_tri)})
    _write(speed, "q8b-ddtree-b16-graph-ps64", ok=False, error="engine start: ValueError: no pages")
    lossless = tmp_path / "lossless"
    _write(lossless, "agree-ddtree-b15-graph-fi-ps64", ok=False,
           error="engine start: RuntimeError: FlashInfer | page size 64 refused")
    stem = tmp_path / "out" / "backends-h200"
    assert report.main(["backends", str(stem), str(lossless), "--speed", str(speed)]) == 0
    out = _load(stem)

    rows = {(r["config"], r["batch"]): r for r in out["rounds"]}
    tree = rows[("q8b-ddtree-b16-graph-fi", 1)]
    assert (tree["backend"], tree["page_size"], tree["chain"], tree["reps"]) == (
        "flashinfer", 1, "q8b-chain-graph-fi", 5)
    want = round(statistics.median(tree_fi) / statistics.median(chain_fi), 3)
    assert tree["ratio_vs_chain"] == want and tree["round_ms"] == statistics.median(tree_fi)
    assert tree["ratio_ci_low"] <= want <= tree["ratio_ci_high"] and tree["ratio_ci_low"] > 1
    assert tree["tok_s"] == round(5 * 64 / sum(r["seconds"] for r in _runs(tree_fi)), 1)
    assert rows[("q8b-chain-graph-fi", 1)]["ratio_vs_chain"] is None  # the reference itself
    assert rows[("q8b-chain-graph", 1)]["backend"] == "triton"
    (side,) = out["chain_fi_vs_triton"]
    assert (side["config"], side["triton"]) == ("q8b-chain-graph-fi", "q8b-chain-graph")
    assert side["ratio"] == round(statistics.median(chain_fi) / statistics.median(chain_tri), 3)
    assert side["ratio_ci_low"] <= side["ratio"] <= side["ratio_ci_high"]

    (failed,) = out["lossless"]
    assert (failed["config"], failed["backend"], failed["page_size"], failed["ok"]) == (
        "agree-ddtree-b15-graph-fi-ps64", "flashinfer", 64, False)
    assert "page size 64 refused" in failed["error"]
    m = out["matrix"]
    assert m["flashinfer"]["64"]["lossless"].startswith("failed: agree-ddtree-b15-graph-fi-ps64: engine start")
    assert m["triton"]["64"]["rounds"].startswith("failed: q8b-ddtree-b16-graph-ps64: engine start: ValueError")
    assert m["flashinfer"]["1"]["rounds"] == "measured" and m["triton"]["1"]["rounds"] == "measured"
    assert m["flashinfer"]["16"] == {"lossless": "not run", "rounds": "not run"}
    assert {r["config"] for r in out["failed"]} == {"agree-ddtree-b15-graph-fi-ps64", "q8b-ddtree-b16-graph-ps64"}
    assert out["t_fit"] is None and "sample-T" in out["t_fit_reason"]
    assert out["commands"] == [f"python -m bench.e2e.report backends {stem} {lossless} --speed {speed}"]
    md = stem.with_name(stem.name + ".md").read_text()
    assert f"| q8b-ddtree-b16-graph-fi | flashinfer | 1 | 1 | 1 | 5 | {tree['round_ms']} | {want} [" in md
    assert "FlashInfer \\| page size 64 refused" in md  # the error's pipe escaped inside its table cell
    assert "Not run: " in md and "flashinfer page size 16 (lossless, rounds)" in md


@pytest.mark.slow  # a whole dry run of gpu_run.sh (about 15-30 s): make test, not make test-fast
def test_dry_run_lossless_matrix_per_backend_and_page_size(tmp_path: Path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OUT": str(tmp_path / "out"), "E2E_DRY_RUN": "1", "E2E_BASE": "0.5.17", "E2E_MODELS": str(tmp_path / "models"),
           "E2E_BUNDLE": ".e2e17fi", "E2E_STAGGER": "0"}
    tag = f"bk{os.getpid()}"
    names = ("agree64-ar-graph-fi,agree64-chain-graph-fi,agree64-ddtree-b15-graph-fi,agree-ar-graph-ps16,"
             "agree-chain-graph-ps16,agree-ddtree-b15-graph-ps16")
    r = subprocess.run(["bash", "bench/e2e/gpu_run.sh", tag, names], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # the driver's own report compares -fi configurations with -fi baselines (one dry run serves both reports)
    # FlashInfer's proofs serve the head-dim-64 models (its kernels have no head dim 16), made by gpu_run.sh
    for name in ("agree-qwen3-hd64", "agree-dflash-hd64", "tiny-qwen3-hd64", "tiny-dflash-hd64"):
        assert json.loads((tmp_path / "models" / name / "config.json").read_text())["head_dim"] == 64, name
    got = json.loads((tmp_path / "out" / f"{tag}.json").read_text())
    assert all(got["configs"][n]["ok"] for n in got["configs"])
    assert set(got["lossless"]) >= {"agree64-chain-graph-fi", "agree64-ddtree-b15-graph-fi", "agree-ddtree-b15-graph-ps16"}
    assert {v["chain"] for v in got["vs_chain"]["agree64-ddtree-b15-graph-fi"].values()} == {"agree64-chain-graph-fi"}
    raw = tmp_path / "out" / f"{tag}-raw.tgz"
    stem = tmp_path / "backends-h200"
    assert report.main(["backends", str(stem), str(raw)]) == 0
    out = _load(stem)
    m = out["matrix"]
    assert m["triton"]["16"]["lossless"] == "identical" and m["flashinfer"]["1"]["lossless"] == "identical"
    assert m["flashinfer"]["64"] == {"lossless": "not run", "rounds": "not run"}
    assert m["triton"]["1"]["lossless"] == "not run" and m["flashinfer"]["16"]["lossless"] == "not run"
    rows = {x["config"]: x for x in out["lossless"]}
    assert {n: (x["backend"], x["page_size"]) for n, x in rows.items()} == {
        "agree64-chain-graph-fi": ("flashinfer", 1), "agree64-ddtree-b15-graph-fi": ("flashinfer", 1),
        "agree-chain-graph-ps16": ("triton", 16), "agree-ddtree-b15-graph-ps16": ("triton", 16)}
    tree = rows["agree-ddtree-b15-graph-ps16"]
    assert tree["ok"] and tree["graph"] and tree["vs_chain"]["chain"] == "agree-chain-graph-ps16"
    assert tree["vs_plain"]["plain"] == "agree-ar-graph-ps16"
    assert tree["vs_plain"]["identical_requests"] == tree["vs_plain"]["requests"] > 0
    assert "stop-bs4" in tree["vs_plain"]["workloads"]
    assert rows["agree64-chain-graph-fi"]["vs_chain"] is None and rows["agree64-chain-graph-fi"]["vs_plain"]
    assert out["rounds"] == [] and out["t_fit"] is None

    extra = tmp_path / "rerun"  # a later raw whose configuration failed to start: its row says why
    _write(extra, "agree64-ddtree-b15-graph-fi", ok=False, error="engine start: ImportError: flashinfer")
    assert report.main(["backends", str(stem), str(raw), str(extra)]) == 0
    out = _load(stem)
    row = next(x for x in out["lossless"] if x["config"] == "agree64-ddtree-b15-graph-fi")
    assert not row["ok"] and row["error"] == "engine start: ImportError: flashinfer" and row["vs_plain"] is None
    assert out["matrix"]["flashinfer"]["1"]["lossless"] == (
        "failed: agree64-ddtree-b15-graph-fi: engine start: ImportError: flashinfer")
