"""DDTree's draft top-k against the chain's draft argmax, at the Qwen3-8B head shape (issue #20 item 3).

Per draft depth the chain (SGLang's DFlash worker, which folds it into the draft CUDA graph) computes the LM-head
logits and an argmax; DDTree computes the same logits and a top-k over the full vocabulary with log-probs
(``patches/ddtree/spec-v2/draft_topk.py`` -> the runtime's ``draft_topk``). For batch 1 / 8 / 32 x 15 draft
positions (block 16), hidden 4096, vocab 151,936, bf16 head, and k = 16 / 32 / 64 (DraftTreeBuilder's k for
budgets 16 / 32 / 64: k = min(budget, V)) it times, as CUDA-graph replays with CUDA events (launch cost excluded,
as in the serving loop):

  (a) head + torch.argmax            the chain
  (b) head + draft_topk              DDTree, through the spec-v2 glue (single rank)
  (c) the selection alone on ready logits: torch.argmax, our draft_topk (Triton: threshold then gather,
      ``topk_select_triton``), the older streaming kernel (``topk_triton``, now the overflow fallback) for
      comparison, the torch reference (impl="torch"), and a bare torch.topk (values only, no log-probs, no tie
      order) for scale

and checks at each shape that the kernel's tokens equal the torch reference's. Criterion: (b) / (a) <= 1.3 at
batch 32 for every k; (c)'s ratio is reported beside it (memory bound: argmax reads the logits once, so does the
kernel).

    python bench/bench_draft_topk.py                  # on a CUDA GPU: bench/results/draft-topk-<gpu>.json / .md
    python bench/bench_draft_topk.py --smoke          # anywhere: tiny shapes, kernels under TRITON_INTERPRET=1
    python bench/bench_draft_topk.py --ks 256,512,1024 --batches 1,32   # large budgets (first-call compile time
                                                                         # is a column: issue #29 item 3)

Without CUDA (and without --smoke) it refuses with exit 2.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.gpu_timing import graph_us  # noqa: E402

COMMAND = "python bench/bench_draft_topk.py"
FULL = dict(vocab=151_936, hidden=4096, batches=(1, 8, 32), depth=15, ks=(16, 32, 64))
SMOKE = dict(vocab=700, hidden=32, batches=(1, 2), depth=2, ks=(16,))
TARGET_RATIO = 1.3


def _load(smoke: bool):
    """The runtime and the spec-v2 glue, loaded by path as an overlay vendors them (no sglang needed)."""
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton.jit decorates the kernels
    sys.path.insert(0, str(ROOT))
    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime

    rt = load_runtime(ROOT / "patches" / "ddtree" / "runtime")
    spec = importlib.util.spec_from_file_location("ddtree_v2_draft_topk", ROOT / "patches/ddtree/spec-v2/draft_topk.py")
    glue = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = glue
    spec.loader.exec_module(glue)
    glue.runtime = lambda: rt
    return rt, glue, importlib.import_module(rt.__name__ + ".topk_select_triton")


def wall_us(fn, iters: int = 1) -> float:
    """Smoke path timer (CPU, interpreter): wall µs per call. Only proves the bench runs."""
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e6 / iters


def measure(rt, glue, kernel, shape: dict, smoke: bool, progress=print) -> list[dict]:
    import torch

    dev = torch.device("cpu" if smoke else "cuda")
    timer = wall_us if smoke else functools.partial(graph_us, reps=10, replays=20, warmup=3)
    gen = torch.Generator(device=dev).manual_seed(20)
    vocab, hidden, depth = shape["vocab"], shape["hidden"], shape["depth"]
    weight = (torch.randn(vocab, hidden, device=dev, generator=gen, dtype=torch.float32) * hidden ** -0.5).to(
        torch.bfloat16)
    head = glue.HeadShard.of(type("Head", (), {"weight": weight})())
    impl = "triton"
    streaming = importlib.import_module(kernel.__name__.rsplit(".", 1)[0] + ".topk_triton")
    rows = []
    for batch in shape["batches"]:
        n = batch * depth
        hs = (torch.randn(n, hidden, device=dev, generator=gen) * 3.0).to(torch.bfloat16)
        logits = torch.matmul(hs, weight.T)  # what the head writes: bf16 [n, V]
        chain = timer(lambda hs=hs: torch.argmax(torch.matmul(hs, weight.T), dim=-1))
        argmax = timer(lambda x=logits: torch.argmax(x, dim=-1))
        for k in shape["ks"]:
            progress(f"batch {batch} ({n} rows) k {k} ...")
            t0 = time.perf_counter()
            lp_t, tok_t = rt.draft_topk(logits.unsqueeze(0), k, impl=impl)  # the first call compiles the kernels
            if not smoke:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            progress(f"  first call (compile + run) {first:.2f} s")
            lp_r, tok_r = rt.draft_topk(logits.unsqueeze(0), k, impl="torch")
            same_tokens = bool(torch.equal(tok_t, tok_r))
            lp_err = float((lp_t - lp_r).abs().max())
            ddtree = timer(lambda hs=hs, k=k: glue.draft_topk(hs, head, k))
            ours = timer(lambda x=logits, k=k: rt.draft_topk(x.unsqueeze(0), k, impl=impl))
            ref = timer(lambda x=logits, k=k: rt.draft_topk(x.unsqueeze(0), k, impl="torch"))
            stream = timer(lambda x=logits, k=k: streaming.topk_logits_lse(x, k))
            *_, over = kernel.topk_logits_lse(logits, k, return_overflow=True)
            bare = timer(lambda x=logits, k=k: torch.topk(x, k, dim=-1))
            sh = kernel.shapes(vocab, k)
            splits, split_len = kernel.plan(n, vocab, sh["chunk"], dev)
            rows.append({
                "batch": batch, "rows": n, "k": k, "budget": k,
                "chain_head_argmax_us": round(chain, 2), "ddtree_head_topk_us": round(ddtree, 2),
                "head_ratio": round(ddtree / chain, 3),
                "argmax_us": round(argmax, 2), "topk_us": round(ours, 2), "topk_ratio": round(ours / argmax, 3),
                "topk_torch_reference_us": round(ref, 2), "torch_topk_values_only_us": round(bare, 2),
                "streaming_kernel_us": round(stream, 2), "overflow_rows": int(over.sum()),
                "logits_bytes": n * vocab * 2, "kernel_splits": splits, "kernel_split_len": split_len,
                "kernel_group": sh["group"], "kernel_cap": sh["cap"], "first_call_s": round(first, 3),
                "tokens_equal_reference": same_tokens,
                "max_logprob_diff": lp_err,
            })
            progress(f"  chain {chain:.1f} us, ddtree {ddtree:.1f} us ({ddtree / chain:.2f}x); "
                     f"argmax {argmax:.1f} us, top-k {ours:.1f} us ({ours / argmax:.2f}x), tokens equal: {same_tokens}")
    return rows


def environment(smoke: bool) -> dict:
    import torch
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "smoke": smoke}
    if torch.cuda.is_available() and not smoke:
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
    return env


def verdict(rows: list[dict], smoke: bool) -> dict:
    """The criterion at the largest batch; a smoke run (CPU wall times of interpreted kernels) claims nothing."""
    big = [r for r in rows if r["batch"] == max(x["batch"] for x in rows)]
    worst = max(r["head_ratio"] for r in big)
    return {"criterion": f"head + draft_topk <= {TARGET_RATIO}x head + argmax at batch {big[0]['batch']}, every k",
            "worst_head_ratio": worst, "met": None if smoke else worst <= TARGET_RATIO,
            "worst_topk_ratio": max(r["topk_ratio"] for r in big),
            "tokens_equal_reference": all(r["tokens_equal_reference"] for r in rows)}


def markdown(result: dict) -> str:
    env, v = result["environment"], result["verdict"]
    met = {True: "met", False: "NOT met", None: "smoke run: CPU wall times of interpreted kernels, no claim"}
    lines = [f"# Draft top-k vs the chain's argmax ({env.get('gpu', 'smoke run')})", "",
             f"`{result['command']}` — vocab {result['shape']['vocab']:,}, hidden {result['shape']['hidden']}, "
             f"{result['shape']['depth']} draft positions per request, bf16 head; "
             + ("wall time per call on CPU" if env["smoke"] else
                "CUDA-graph replays timed with CUDA events (median of 5 windows)") + ". torch " + env["torch"] + ", triton " + env["triton"] + ".", "",
             f"**{v['criterion']}: worst {v['worst_head_ratio']}x — {met[v['met']]}.** "
             f"Selection alone (top-k / argmax on ready logits), worst at that batch: {v['worst_topk_ratio']}x. "
             f"Kernel tokens equal the torch reference at every shape: {v['tokens_equal_reference']}.", "",
             "| batch | rows | k | chain: head+argmax µs | DDTree: head+top-k µs | ratio | argmax µs | top-k µs | "
             "ratio | streaming kernel µs | torch reference µs | torch.topk (values) µs | pass-1 splits | "
             "overflow rows | first call s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['batch']} | {r['rows']} | {r['k']} | {r['chain_head_argmax_us']} | "
                     f"{r['ddtree_head_topk_us']} | {r['head_ratio']} | {r['argmax_us']} | {r['topk_us']} | "
                     f"{r['topk_ratio']} | {r['streaming_kernel_us']} | {r['topk_torch_reference_us']} | "
                     f"{r['torch_topk_values_only_us']} | {r['kernel_splits']} x {r['kernel_split_len']} | "
                     f"{r['overflow_rows']} | {r['first_call_s']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for the .json and .md")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1 (no timing "
                    "claim: proves the bench and the kernels run)")
    ap.add_argument("--ks", help="comma-separated k to measure instead of the default (e.g. 256,512,1024: budgets "
                    "that large; the result is then named draft-topk-<gpu>-k<largest>)")
    ap.add_argument("--batches", help="comma-separated batch sizes instead of the default")
    args = ap.parse_args(argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("bench_draft_topk: needs a CUDA GPU (torch sees none); use --smoke for the CPU smoke run",
              file=sys.stderr)
        return 2
    rt, glue, kernel = _load(args.smoke)
    shape = dict(SMOKE if args.smoke else FULL)
    try:
        if args.ks:
            shape["ks"] = tuple(int(k) for k in args.ks.split(","))
        if args.batches:
            shape["batches"] = tuple(int(b) for b in args.batches.split(","))
    except ValueError:
        print(f"bench_draft_topk: --ks / --batches take comma-separated integers, got {args.ks or args.batches!r}",
              file=sys.stderr)
        return 2
    if not all(1 <= k <= shape["vocab"] for k in shape["ks"]) or not all(b >= 1 for b in shape["batches"]):
        print(f"bench_draft_topk: every k must be in [1, {shape['vocab']}] and every batch >= 1", file=sys.stderr)
        return 2
    rows = measure(rt, glue, kernel, shape, args.smoke, progress=lambda m: print(m, file=sys.stderr, flush=True))
    extra = (f" --ks {args.ks}" if args.ks else "") + (f" --batches {args.batches}" if args.batches else "")
    result = {"command": COMMAND + (" --smoke" if args.smoke else "") + extra, "environment": environment(args.smoke),
              "shape": {k: v for k, v in shape.items()}, "rows": rows, "verdict": verdict(rows, args.smoke)}
    name = "draft-topk-smoke" if args.smoke else "draft-topk-" + (
        "h200" if "H200" in result["environment"].get("gpu", "") else "gpu")
    if args.ks:
        name += f"-k{max(shape['ks'])}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["verdict"]["tokens_equal_reference"] else 1


if __name__ == "__main__":
    sys.exit(main())
