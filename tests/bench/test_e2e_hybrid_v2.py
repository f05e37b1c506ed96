"""The 0.5.17 hybrid GPU proof's plumbing on CPU (bench/e2e: driver.py, dry_engine.py, gdn_share.py,
report.py hybrid-v2): the engine arguments of its configurations, the GPU assignment, and the report from dry-run
results (the stand-in engine's outputs and profiler traces; what the real run's numbers are is the GPU's job)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _py(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "E2E_BASE": "0.5.17", **(env or {})})


def test_engine_arguments_of_the_hybrid_configurations():
    code = r'''
import json
from bench.e2e import driver as d
out = {n: d.engine_kwargs(d.parse(n)) for n in ("hyblive-ddtree-b16-graph", "hyblive-ar-noradix",
                                                 "q36-ddtree-b32-graph-mrr8-prof", "q36-chain-graph-mrr16-prof")}
out["batches"] = {n: d.speed_batches(d.parse(n)) for n in ("q36-ddtree-b128-graph-mrr1", "q36-ddtree-b32-graph-mrr8")}
print(json.dumps(out))
'''
    r = _py(code, env={"E2E_SPEED_BATCHES": "1,8,16"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    live = got["hyblive-ddtree-b16-graph"]
    assert live["mamba_radix_cache_strategy"] == "extra_buffer" and "disable_radix_cache" not in live
    assert live["speculative_ddtree_budget"] == 16 and live["cuda_graph_backend_decode"] == "full"
    assert got["hyblive-ar-noradix"]["disable_radix_cache"] is True
    q = got["q36-ddtree-b32-graph-mrr8-prof"]
    assert q["load_format"] == "dummy" and q["max_running_requests"] == 8 and q["enable_multimodal"] is False
    assert q["cuda_graph_bs_decode"] == [1, 8] and "cuda_graph_max_bs_decode" not in q
    assert q["mamba_full_memory_ratio"] == 8.0 and q["mem_fraction_static"] == 0.88
    assert got["q36-chain-graph-mrr16-prof"]["cuda_graph_bs_decode"] == [1, 8, 16]
    assert got["batches"] == {"q36-ddtree-b128-graph-mrr1": [1], "q36-ddtree-b32-graph-mrr8": [1, 8]}


def test_configurations_spread_over_gpus():
    code = r'''
import json
from bench.e2e import driver as d
gpus = ["0", "1", "2"]
running = {}
order = []
for n in ["q36-chain-graph-mrr16", "q36-ddtree-b16-graph-mrr16", "q36-ddtree-b32-graph-mrr8", "hyblive-ar",
          "hyblive-chain", "hyblive-ddtree-b4"]:
    g = d.gpu_slot(n, running, 2, gpus)
    order.append([n, g])
    if g is not None:
        running[n] = (None, 0.0, g)
print(json.dumps({"order": order, "one_gpu": d.gpu_slot("q36-chain-graph", {}, 1, []),
                  "one_gpu_full": d.gpu_slot("hyblive-ar", {"x": (None, 0.0, "")}, 1, [])}))
'''
    r = _py(code)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["order"] == [["q36-chain-graph-mrr16", "1"], ["q36-ddtree-b16-graph-mrr16", "2"],
                            ["q36-ddtree-b32-graph-mrr8", None],  # both big GPUs busy: waits
                            ["hyblive-ar", "0"], ["hyblive-chain", "0"], ["hyblive-ddtree-b4", None]]  # 2 workers
    assert got["one_gpu"] == "" and got["one_gpu_full"] is None


@pytest.mark.slow  # a whole dry-run proof: make test, not make test-fast
def test_report_from_dry_results(tmp_path: Path):
    raw = tmp_path / "raw"
    raw.mkdir()
    names = ["hyblive-ar", "hyblive-arv", "hyblive-chain", "hyblive-ddtree-b16", "q36-chain-graph-mrr16-prof",
             "q36-ddtree-b32-graph-mrr8-prof"]
    env = {"E2E_DRY_RUN": "1", "E2E_SPEED_BATCHES": "1,8,16", "E2E_PROF_BATCHES": "1,8,16", "E2E_SPEED_TOKENS": "32",
           "E2E_MODELS": str(tmp_path / "models")}
    for n in names:
        r = subprocess.run([sys.executable, "-m", "bench.e2e.driver", "run", n, str(raw)], capture_output=True,
                           cwd=ROOT, text=True, timeout=300, env={**os.environ, "E2E_BASE": "0.5.17", **env})
        assert r.returncode == 0, (n, r.stdout[-2000:], r.stderr[-2000:])
    (raw / "logs").mkdir()
    (raw / "logs" / "q36-ddtree-b32-graph-mrr8-prof.log").write_text(
        "[x] DDTree hybrid: budget 32 fits the per-node recurrent states (largest that fits: 39 at 8 max running "
        "requests).\n")
    kernels = tmp_path / "k.json"
    kernels.write_text(json.dumps({"ok": True, "device": "cuda", "gpu": "H200", "dtype": "torch.bfloat16",
                                   "shapes": {"num_k_heads": 16, "num_v_heads": 48, "head_k_dim": 128,
                                              "head_v_dim": 128, "conv_kernel": 4},
                                   "cases": [{"case": "b256-bs8-draft-graph-track", "ok": True, "max_out_err": 1e-3,
                                              "max_state_err": 2e-4, "window_exact": True,
                                              "commit_equals_sequential_path": True,
                                              "track_slot_is_tracked_node": True, "tracked": 3,
                                              "accept_len_max": 4, "seconds": 2.0}]}))
    stem = tmp_path / "out" / "hybrid"
    stem.parent.mkdir()
    r = subprocess.run([sys.executable, "-m", "bench.e2e.report", "hybrid-v2", str(stem), str(raw), "--kernels", str(kernels)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "E2E_BASE": "0.5.17"})
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(stem.with_suffix(".json").read_text())
    md = stem.with_suffix(".md").read_text()
    assert s["kernels"]["ok"] and "b256-bs8-draft-graph-track" in md
    rows = {(r["config"], r["batch"]): r for r in s["lossless"]}
    assert all(rows[("hyblive-ddtree-b16", b)]["vs_chain"]["identical"] for b in (1, 4, 16))
    assert all(rows[("hyblive-chain", b)]["vs_arv"]["identical"] for b in (1, 4, 16))
    q = {(r["variant"], r["batch"]): r for r in s["round_27b"]["rows"]}
    assert "not_run" in q[(32, 16)] and q[(32, 8)]["round_ms"] is not None and q[("chain", 16)]["round_ms"]
    # the dry trace: 48 GDN layers x (3 + 1 + 6) us of tree verify kernels + a 4 us commit in a 690 us round
    assert q[(32, 1)]["gdn_verify_share"] == round(480 / 690, 4)
    assert q[("chain", 1)]["gdn_verify_share"] == round(48 * 6 / (206 + 48 * 6 + 2), 4)
    assert s["round_27b"]["memory_check"]["q36-ddtree-b32-graph-mrr8-prof"]["largest_fit"] == 39
    assert "| 32 | 16 | not run |" in md


@pytest.mark.slow  # a whole dry-run proof: make test, not make test-fast
def test_a_failed_engine_start_is_recorded_with_its_error(tmp_path: Path):
    """An engine whose child dies at start-up (SGLang: the scheduler logs its traceback and SIGQUITs the parent)
    leaves a record with the child's error instead of killing the driver: through the driver's own SIGQUIT handler,
    and, where the process tree was killed anyway (SGLang's default handler), from the orchestrator reading the
    log. The report lists both; the other configuration runs; no child of the failed engines is left."""
    import psutil

    raw = tmp_path / "raw"
    marker = f"sliding_window ({tmp_path.name})"
    failing = ["q36-ddtree-b16-graph-mrr16-prof", "q36-ddtree-b32-graph-mrr8-prof"]
    env = {"E2E_DRY_RUN": "1", "E2E_SPEED_BATCHES": "1,8,16", "E2E_PROF_BATCHES": "1", "E2E_SPEED_TOKENS": "16",
           "E2E_MODELS": str(tmp_path / "models"), "E2E_STAGGER": "0", "E2E_WORKERS": "1", "E2E_DEADLINE": "200",
           "E2E_DRY_FAIL_START": ",".join(failing), "E2E_DRY_FAIL_ERROR": f"ValueError: DFLASH needs {marker}."}
    names = ["q36-chain-graph-mrr16-prof", *failing]
    for default in ("0", "1"):  # the driver's handler, then SGLang's default (the whole tree killed)
        out = raw / default
        r = subprocess.run([sys.executable, "-m", "bench.e2e.driver", "orchestrate", str(out), ",".join(names)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "E2E_BASE": "0.5.17", **env, "E2E_DRY_DEFAULT_SIGQUIT": default})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        recs = {n: json.loads((out / f"{n}.json").read_text()) for n in names}
        assert recs["q36-chain-graph-mrr16-prof"]["ok"]
        for n in failing:
            rec = recs[n]
            assert not rec["ok"] and "checkpoint" not in rec, rec
            assert rec["error"].startswith(f"engine start: ValueError: DFLASH needs {marker}."), rec["error"]
            assert rec["config"]["name"] == n
        if default == "1":
            assert "died at engine start, recorded from its log" in r.stdout
            assert all("(exit status -9)" in recs[n]["error"] for n in failing), recs
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not left, left
    stem = tmp_path / "report" / "h"
    stem.parent.mkdir()
    r = subprocess.run([sys.executable, "-m", "bench.e2e.report", "hybrid-v2", str(stem), str(raw / "0")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "E2E_BASE": "0.5.17"})
    assert r.returncode == 0, r.stderr[-3000:]
    md = stem.with_suffix(".md").read_text()
    for n in failing:
        assert f"- `{n}`: engine start: ValueError: DFLASH needs {marker}." in md, md
    assert json.loads(stem.with_suffix(".json").read_text())["configs"][failing[0]]["ok"] is False
