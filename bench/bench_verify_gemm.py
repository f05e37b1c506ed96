"""The target's linear layers in one verify forward, by verify width: does a tree of budget B (B + 1 verified tokens
per request) pay for the GEMM shape M = batch x (B + 1) beyond its share of tokens? (issues #29, #24)

A DFLASH chain of block 16 verifies 16 tokens per request; a DDTree tree of budget 16 verifies 17 (the root and 16
nodes). Every linear layer of the target then multiplies an M x K activation by its weight, M = batch x width. cuBLAS
tiles M in blocks (64, 128, 256 rows), so M = 32 x 17 = 544 may cost a whole extra row of tiles over M = 512 where the
token count grew by 6 %. This benchmark times exactly those GEMMs, nothing else: every linear layer of the target
(attention projections, MLP, LM head over every verified token) with random bf16 weights at the real shapes, the
whole stack captured in one CUDA graph and timed with CUDA events (median of 5 windows of 10 replays), at
batch 1 / 8 / 16 / 32 x width 16 / 17 / 32 / 33 / 64 / 65. Weights are allocated twice per shape and used
alternately, so no layer finds its weights in L2.

    python bench/bench_verify_gemm.py                      # on a CUDA GPU: bench/results/verify-gemm-<gpu>.json / .md
    python bench/bench_verify_gemm.py --models q8b --batches 1,32 --widths 16,17
    python bench/bench_verify_gemm.py --smoke              # anywhere: tiny shapes on the CPU, wall time

Without CUDA (and without --smoke) it refuses with exit 2, writing nothing.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_args import BadArgs, ints, need_cuda, pick, refuse  # noqa: E402
from bench.gpu_timing import graph_us  # noqa: E402

PROG = "bench_verify_gemm"

COMMAND = "python bench/bench_verify_gemm.py"

#: (name, in features, out features, how many per forward) for each linear layer of the target, from the configs
#: bench/e2e/models/mk_shapes.py serves (Qwen3-8B; Qwen3.6-27B: 48 GatedDeltaNet + 16 gated-attention layers)
MODELS = {
    "q8b": dict(title="Qwen3-8B (36 layers, hidden 4096)", layers=[
        ("qkv_proj", 4096, 4096 + 2 * 1024, 36), ("o_proj", 4096, 4096, 36),
        ("gate_up_proj", 4096, 2 * 12288, 36), ("down_proj", 12288, 4096, 36),
        ("lm_head", 4096, 151936, 1)]),
    "q36": dict(title="Qwen3.6-27B (48 GatedDeltaNet + 16 attention layers, hidden 5120)", layers=[
        ("gdn_in_proj_qkvz", 5120, 2 * 16 * 128 + 2 * 48 * 128, 48), ("gdn_in_proj_ba", 5120, 2 * 48, 48),
        ("gdn_out_proj", 48 * 128, 5120, 48),
        ("attn_qkv_proj", 5120, 2 * 24 * 256 + 2 * 4 * 256, 16), ("attn_o_proj", 24 * 256, 5120, 16),
        ("gate_up_proj", 5120, 2 * 17408, 64), ("down_proj", 17408, 5120, 64),
        ("lm_head", 5120, 248320, 1)]),
}
SMOKE_MODELS = {"tiny": dict(title="tiny (smoke)", layers=[("proj", 32, 48, 2), ("lm_head", 32, 100, 1)])}
BATCHES = (1, 8, 16, 32)
WIDTHS = (16, 17, 32, 33, 64, 65)


def stack(torch, spec: dict, device: str, dtype) -> tuple[list, dict]:
    """Two weights per layer shape (used alternately, so a layer never reads the previous one's from L2)."""
    weights = {}
    for name, k, n, _count in spec["layers"]:
        weights[name] = [torch.randn((n, k), device=device, dtype=dtype) * 0.02 for _ in range(2)]
    order = [(name, i) for name, _k, _n, count in spec["layers"] for i in range(count)]
    return order, weights


def forward_fn(torch, spec: dict, order: list, weights: dict, m: int, device: str, dtype):
    """The stack's GEMMs for M = m rows: each layer reads an activation of its input width, writes its output."""
    import torch.nn.functional as F

    ins = {k: torch.randn((m, k), device=device, dtype=dtype) for _n, k, _o, _c in spec["layers"]}
    outs = {name: torch.empty((m, n), device=device, dtype=dtype) for name, _k, n, _c in spec["layers"]}
    dims = {name: k for name, k, _n, _c in spec["layers"]}

    def run() -> None:
        for name, i in order:
            outs[name].copy_(F.linear(ins[dims[name]], weights[name][i % 2]))
    return run


def wall_ms(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(torch, models: dict, batches, widths, smoke: bool, progress=print) -> list[dict]:
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    rows = []
    for key, spec in models.items():
        order, weights = stack(torch, spec, device, dtype)
        for bs in batches:
            base = None
            for w in widths:
                m = bs * w
                fn = forward_fn(torch, spec, order, weights, m, device, dtype)
                ms = wall_ms(fn) if smoke else graph_us(fn, warmup=1) / 1000.0
                if base is None:
                    base = (w, ms)
                row = dict(model=key, batch=bs, width=w, m=m, ms=round(ms, 4),
                           ms_per_token_us=round(ms * 1e3 / m, 3),
                           vs_first_width=round(ms / base[1], 4), first_width=base[0],
                           tokens_vs_first_width=round(w / base[0], 4))
                rows.append(row)
                progress(f"{key} bs={bs} width={w} (M={m}): {ms:.3f} ms, x{row['vs_first_width']} for "
                         f"x{row['tokens_vs_first_width']} tokens")
        del weights
        if not smoke:
            torch.cuda.empty_cache()
    return rows


def environment(torch, smoke: bool) -> dict:
    env = dict(torch=torch.__version__, python=platform.python_version(), smoke=smoke)
    if not smoke:
        env["device"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def markdown(result: dict) -> str:
    env = result["environment"]
    where = "CPU smoke run (tiny shapes, wall time)" if env["smoke"] else (
        f"{env['device']}, torch {env['torch']} (CUDA {env['cuda']}); bf16 weights and activations, the whole stack "
        "of linear layers in one CUDA graph, CUDA events, median of 5 windows of 10 replays")
    lines = ["# The target's linear layers per verify forward, by verify width", "",
             f"`{result['command']}` — {where}.", "",
             "Only the GEMMs of one verify forward (every linear layer and the LM head over every verified token; no "
             "attention, norms or the draft). `x time` and `x tokens` are against the first width at the same batch.",
             ""]
    for key, spec in result["models"].items():
        lines += [f"## {spec['title']}", "", "| batch | width | M | ms | µs / token | x time | x tokens |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in result["rows"] if r["model"] == key):
            lines.append(f"| {r['batch']} | {r['width']} | {r['m']} | {r['ms']} | {r['ms_per_token_us']} | "
                         f"{r['vs_first_width']} | {r['tokens_vs_first_width']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (wall time), anywhere")
    ap.add_argument("--models", default=None, help=f"comma list of {', '.join(MODELS)} (default: all)")
    ap.add_argument("--batches", default=None, help="batch sizes, comma list (default 1,8,16,32)")
    ap.add_argument("--widths", default=None, help="verify widths, comma list; the first is the reference "
                                                   "(default 16,17,32,33,64,65)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results folder")
    args = ap.parse_args(argv)
    import torch

    try:
        need_cuda(PROG, args.smoke)
        table = pick(SMOKE_MODELS if args.smoke else MODELS, args.models, "models", PROG)
        batches = ints(args.batches, "batches", PROG) if args.batches else ((1, 2) if args.smoke else BATCHES)
        widths = ints(args.widths, "widths", PROG) if args.widths else ((4, 5) if args.smoke else WIDTHS)
    except BadArgs as exc:
        return refuse(exc)
    out = Path(args.out)
    if not out.is_dir():
        print(f"bench_verify_gemm: --out {out}: no such folder", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = measure(torch, table, batches, widths, args.smoke)
    env = environment(torch, args.smoke)
    result = dict(command=" ".join([COMMAND] + (argv if argv is not None else sys.argv[1:])), environment=env,
                  models={k: dict(title=v["title"], layers=v["layers"]) for k, v in table.items()}, rows=rows)
    stem = "verify-gemm-smoke" if args.smoke else "verify-gemm-" + env["device"].split()[-1].lower()
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(result) + "\n")
    print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
