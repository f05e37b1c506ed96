"""Launches and host µs per decode round (bench/e2e/round_stats_hook, round_stats.py) and their place in the e2e
harness, on CPU: the hook wraps a worker module with SGLang's names in a real subprocess (as it does in the
scheduler process), and the driver's dry run (`-launch`, `-sched` configurations) carries the summaries into the
report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "bench" / "e2e"

from bench.e2e import round_stats  # noqa: E402  (after the torch skip)

WORKER = '''
import torch
from sglang.srt.managers.tp_worker import TpModelWorker


class Mode:
    def __init__(self, decode):
        self.decode = decode

    def is_decode(self):
        return self.decode


class Batch:
    def __init__(self, bs, decode=True):
        self.forward_mode = Mode(decode)
        self.seq_lens = torch.zeros(bs)
        self.is_extend_in_batch = False


class DFlashWorkerV2:
    def __init__(self):
        self.target_worker = TpModelWorker()

    def forward_batch_generation(self, batch, on_publish=None):
        self.target_worker.forward_batch_generation(batch)  # nested: not a round of its own
        return torch.ones(8).cumsum(0)[-1]
'''


def _fake_sglang(root: Path) -> None:
    for pkg in ("sglang", "sglang/srt", "sglang/srt/speculative", "sglang/srt/managers"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "sglang/srt/managers/tp_worker.py").write_text(textwrap.dedent('''
        class TpModelWorker:
            def forward_batch_generation(self, batch, **kw):
                return 0
        '''))
    (root / "sglang/srt/speculative/dflash_worker_v2.py").write_text(WORKER)


def test_hook_counts_decode_rounds_of_the_outermost_worker(tmp_path):
    _fake_sglang(tmp_path / "site")
    (tmp_path / "next").mkdir()
    (tmp_path / "next" / "sitecustomize.py").write_text("import os\nos.environ['NEXT_SITECUSTOMIZE_RAN'] = '1'\n")
    out = tmp_path / "stats"
    script = textwrap.dedent('''
        import os
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, Batch
        w = DFlashWorkerV2()
        w.forward_batch_generation(Batch(4, decode=False))  # a prefill: not a round
        for _ in range(9):
            w.forward_batch_generation(Batch(1))
        for _ in range(3):
            w.forward_batch_generation(Batch(8), on_publish=None)
        print("NEXT", os.environ.get("NEXT_SITECUSTOMIZE_RAN"))
        ''')
    env = {**os.environ, "DDTREE_ROUND_STATS": str(out), "DDTREE_ROUND_STATS_WARMUP": "2",
           "DDTREE_ROUND_STATS_PROFILED": "3",
           "PYTHONPATH": os.pathsep.join([str(E2E / "round_stats_hook"), str(tmp_path / "next"),
                                          str(tmp_path / "site"), str(ROOT)])}  # as driver.config_env lays it out
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NEXT 1" in r.stdout, "the next sitecustomize on the path still runs"
    (f,) = out.glob("round-stats-*.json")
    d = json.loads(f.read_text())
    assert d["worker"] == "DFlashWorkerV2" and d["warmup"] == 2 and d["profiled_rounds"] == 3
    assert len(d["host_us"]["1"]) == 6 and len(d["profiled"]["1"]) == 3  # 9 rounds: 2 warm-up, 3 profiled, 4 after
    assert len(d["host_us"].get("8", [])) == 2 and len(d["profiled"]["8"]) == 1  # written at its first profiled one
    assert "4" not in d["host_us"] and "4" not in d["profiled"]
    rec = d["profiled"]["1"][0]
    assert set(rec) == {"host_us", "kernel_launches", "graph_launches", "copies", "gpu_kernels"}
    assert rec["kernel_launches"] == rec["graph_launches"] == 0  # CPU: no CUDA calls to count
    s = round_stats.summarize(out)
    assert s["batches"]["1"]["rounds"] == 9 and s["batches"]["1"]["host_rounds"] == 4  # warm-up dropped
    assert s["batches"]["1"]["kernel_launches"] == 0 and s["batches"]["1"]["host_us_median"] > 0


def test_event_counts_by_name_and_device():
    hook = E2E / "round_stats_hook" / "sitecustomize.py"
    ns: dict = {"__file__": str(hook), "__name__": "round_stats_hook_test"}
    os.environ.pop("DDTREE_ROUND_STATS", None)
    exec(compile(hook.read_text(), str(hook), "exec"), ns)  # noqa: S102 - the hook's own counting function
    ev = lambda name, dev="DeviceType.CPU": SimpleNamespace(name=name, device_type=dev)  # noqa: E731
    events = [ev("cudaLaunchKernel"), ev("cudaLaunchKernel"), ev("cuLaunchKernelEx"), ev("cudaGraphLaunch"),
              ev("cudaMemcpyAsync"), ev("aten::add"), ev("void gemm<...>", "DeviceType.CUDA"),
              ev("_build_tree_kernel", "DeviceType.CUDA"), ev("Memcpy DtoD", "DeviceType.CUDA")]
    assert ns["count_events"](events) == {"kernel_launches": 3, "graph_launches": 1, "copies": 1, "gpu_kernels": 2}


def test_dry_run_carries_round_stats_and_schedule_into_the_report(tmp_path):
    res = tmp_path / "res"
    env = {**os.environ, "E2E_DRY_RUN": "1", "E2E_BASE": "0.5.17", "E2E_MODELS": str(tmp_path / "models"),
           "E2E_SPEED_BATCHES": "1,8", "E2E_SPEED_TOKENS": "48", "E2E_WORKERS": "2", "E2E_STAGGER": "0",
           "E2E_DEADLINE": "200", "E2E_DDTREE_SCHEDULE": "1:64,8:0", "PYTHONUNBUFFERED": "1"}
    env.pop("DDTREE_ROUND_STATS", None)
    names = "q8b-chain-graph-launch,q8b-ddtree-sched-graph-launch"
    r = subprocess.run([sys.executable, "-m", "bench.e2e.driver", "orchestrate", str(res), names], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    sched = json.loads((res / "q8b-ddtree-sched-graph-launch.json").read_text())
    assert sched["ok"], sched.get("error")
    assert sched["config"]["budget"] == "1:64,8:0" and sched["config"]["round_stats"]
    r = subprocess.run([sys.executable, "-m", "bench.e2e.driver", "report", str(res), str(tmp_path / "rep")],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "rep.json").read_text())
    for name in names.split(","):
        batches = summary["round_stats"][name]["batches"]
        assert {"1", "8"} <= set(batches), batches
        assert batches["1"]["rounds"] > 20 and batches["1"]["kernel_launches"] == 0  # profiled rounds reached
    md = (tmp_path / "rep.md").read_text()
    assert "## Launches and host µs per decode round" in md and "| q8b-ddtree-sched-graph-launch | 8 |" in md
