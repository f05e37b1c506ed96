"""Benchmark the DDTree reference engine on CPU: tokens/s and acceptance length, AR vs chain vs DDTree.

Why: the sandbox's probes report acceptance length from this engine, so we record what a healthy engine
gives (and how fast) on a CPU host. Numbers are for the tiny seeded model (see refengine/models.py), with one
torch thread, batch 1, the runtime's plain-torch path (impl="auto" on CPU). On a tiny model the target
forward costs about the same for 1 or 65 tokens, so tokens/s tracks acceptance minus per-round overhead.

Usage: python bench/bench_refengine.py [--max-new-tokens 96] [--repeats 5] [--out bench/results/refengine-cpu.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PKG_DIR = REPO / "ddtree_deploy" / "sandbox" / "refengine"
RUNTIME_DIR = Path(os.environ.get("DDTREE_RUNTIME_PATH") or REPO / "patches" / "ddtree" / "runtime")
PROMPTS = [
    "Hello world",
    "def fibonacci(n):",
    "The quick brown fox jumps over",
    "0123456789",
    "Speculative decoding with a draft tree",
    "{\"key\": [1, 2, 3]}",
]


def _load_engine_package():
    """Import ddtree_deploy/sandbox/refengine under its deployed name, as the sandbox hosts run it."""
    if "ddtree_refengine" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "ddtree_refengine", PKG_DIR / "__init__.py", submodule_search_locations=[str(PKG_DIR)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["ddtree_refengine"] = module
        spec.loader.exec_module(module)
    return sys.modules["ddtree_refengine"]


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run(max_new: int, repeats: int, block_size: int, budgets: list[int]) -> dict:
    _load_engine_package()
    from ddtree_refengine.decode import Engine, SamplingParams
    from ddtree_refengine.models import ModelConfig, build_target
    from ddtree_refengine.runtime_loader import describe, load_runtime
    from ddtree_refengine.tokenizer import encode

    torch.set_num_threads(1)
    runtime = load_runtime(RUNTIME_DIR)
    cfg = ModelConfig()
    target = build_target(cfg)
    configs = [("AR", Engine(target, "NONE")), ("DFLASH chain", Engine(target, "DFLASH", runtime, 1, block_size))]
    configs += [(f"DDTREE b={b}", Engine(target, "DDTREE", runtime, b, block_size)) for b in budgets]
    rows = []
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_new, temperature)
        ar_ref = {p: configs[0][1].generate(encode(p), params, seed=i).output_ids for i, p in enumerate(PROMPTS)}
        stats = {name: {"rates": [], "tokens": 0, "rounds": 0, "commits": 0, "identical": True} for name, _ in configs}
        for _, engine in configs:
            engine.generate(encode("warm-up"), SamplingParams(8, temperature))
        # Configs interleaved within each repeat, so load drift on a shared host hits all of them alike.
        for _ in range(repeats):
            for name, engine in configs:
                st, t0, n = stats[name], time.perf_counter(), 0
                for i, prompt in enumerate(PROMPTS):
                    res = engine.generate(encode(prompt), params, seed=i)
                    n += len(res.output_ids)
                    st["rounds"] += res.verify_rounds
                    st["commits"] += sum(res.round_commits)
                    st["identical"] &= res.output_ids == ar_ref[prompt]
                st["rates"].append(n / (time.perf_counter() - t0))
                st["tokens"] += n
        for name, _ in configs:
            st = stats[name]
            row = {
                "config": name,
                "temperature": temperature,
                "tokens_per_s_median": round(statistics.median(st["rates"]), 1),
                "tokens_per_s_runs": [round(r, 1) for r in st["rates"]],
                "accept_length": round(st["commits"] / st["rounds"], 3) if st["rounds"] else 1.0,
                "verify_rounds": st["rounds"],
                "tokens": st["tokens"],
            }
            if temperature == 0.0:
                row["greedy_output_equals_ar"] = st["identical"]
            rows.append(row)
            print(f"T={temperature:<3} {name:<14} {row['tokens_per_s_median']:>8.1f} tok/s  "
                  f"accept {row['accept_length']:.2f}", flush=True)
    return {
        "benchmark": "refengine-cpu",
        "what": "tokens/s (median of repeats over all prompts) and mean tokens committed per verify round",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": _git_commit(),
        "host": {"machine": platform.machine(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                 "python": platform.python_version(), "torch_threads": 1, "loadavg_1m_at_end": os.getloadavg()[0]},
        "model": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "dtype": "float64",
        "runtime": describe(runtime),
        "block_size": block_size,
        "prompts": len(PROMPTS),
        "max_new_tokens": max_new,
        "repeats": repeats,
        "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "refengine-cpu.json")
    args = ap.parse_args()
    result = run(args.max_new_tokens, args.repeats, args.block_size, args.budgets)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
