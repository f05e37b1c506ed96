"""The target's attention in one verify forward: SGLang's triton extend kernel for the chain (causal, no mask) and
for a tree (its custom-mask path), against DDTree's tree-verify kernel (patches/ddtree/runtime/tree_attn*.py),
at the Qwen3-8B and Qwen3.6-27B attention shapes (issues #29, #24).

For each shape, batch and verify width it times every attention layer of one verify forward (36 for Qwen3-8B,
16 for Qwen3.6-27B; each layer its own KV pool, so no layer finds the context in L2) captured in one CUDA graph,
CUDA events, median of 5 windows of 10 replays; and checks DDTree's kernel against SGLang's custom-mask kernel on
the same inputs (max abs difference of the bf16 outputs, and the float32 torch reference on one layer).

    python bench/bench_verify_attention.py     # on a CUDA GPU with SGLang importable: bench/results/verify-attention-<gpu>.*
    python bench/bench_verify_attention.py --shapes q8b --batches 1,32 --context 560
    python bench/bench_verify_attention.py --smoke   # anywhere: tiny shapes, DDTree's kernel and the reference only

Without CUDA (and without --smoke) it refuses with exit 2, writing nothing; without SGLang on the path the SGLang
columns are left out and the run says so.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_args import BadArgs, ints, need_cuda, pick, refuse  # noqa: E402
from bench.gpu_timing import graph_us  # noqa: E402

PROG = "bench_verify_attention"

COMMAND = "python bench/bench_verify_attention.py"
#: attention layers, query heads, KV heads, head dim of the targets bench/e2e/models/mk_shapes.py serves
SHAPES = {"q8b": dict(title="Qwen3-8B (36 layers, 32 / 8 heads of 128)", layers=36, hq=32, hkv=8, d=128),
          "q36": dict(title="Qwen3.6-27B attention layers (16 layers, 24 / 4 heads of 256)", layers=16, hq=24, hkv=4,
                      d=256)}
SMOKE_SHAPES = {"tiny": dict(title="tiny (smoke)", layers=2, hq=4, hkv=2, d=16)}
WIDTHS = (16, 17, 65)


def load_runtime(smoke: bool):
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    try:  # the runtime the overlay ships, where SGLang with the DDTree overlay is on the path (the GPU machine)
        from sglang.srt.speculative import ddtree as rt

        return rt
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT))
    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime as load

    return load(ROOT / "patches" / "ddtree" / "runtime")


def sglang_extend():
    """SGLang's triton extend attention, or None when SGLang is not importable."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except Exception:  # noqa: BLE001 - any import failure means: not on this machine
        try:
            from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
        except Exception:  # noqa: BLE001
            return None
    return extend_attention_fwd


def make_inputs(torch, shape: dict, batch: int, width: int, context: int, device, dtype, gen):
    """One verify's inputs per layer: the pool (context slots shuffled), q / k / v of the verified tokens, and
    SGLang's flat mask with a chain-shaped tree block (every node sees the nodes before it: any ancestor mask
    costs the kernels the same)."""
    hq, hkv, d = shape["hq"], shape["hkv"], shape["d"]
    tokens = batch * width
    slots = batch * (context + width) + 1
    kv_indices = torch.randperm(slots - 1, generator=gen)[: batch * context].to(torch.int32).to(device)
    kv_indptr = (torch.arange(batch + 1, dtype=torch.int32) * context).to(device)
    qo_indptr = (torch.arange(batch + 1, dtype=torch.int32) * width).to(device)
    mask_indptr = (torch.arange(batch + 1, dtype=torch.int64) * width * (context + width)).to(device)
    block = torch.ones((width, context + width), dtype=torch.bool)
    block[:, context:] = torch.tril(torch.ones((width, width), dtype=torch.bool))
    mask = block.reshape(-1).repeat(batch).to(device)
    layers = []
    for _ in range(shape["layers"]):
        layers.append(dict(
            q=torch.randn((tokens, hq, d), generator=gen).to(device, dtype),
            k=torch.randn((tokens, hkv, d), generator=gen).to(device, dtype),
            v=torch.randn((tokens, hkv, d), generator=gen).to(device, dtype),
            k_buf=torch.randn((slots, hkv, d), generator=gen).to(device, dtype),
            v_buf=torch.randn((slots, hkv, d), generator=gen).to(device, dtype),
            o=torch.empty((tokens, hq, d), device=device, dtype=dtype)))
    return dict(layers=layers, kv_indices=kv_indices, kv_indptr=kv_indptr, qo_indptr=qo_indptr,
                mask_indptr=mask_indptr, mask=mask, width=width, scale=1.0 / math.sqrt(d))


def variant_fn(kind: str, rt, sg, inp: dict, splits=None):
    """A function running every layer's attention once: ``sglang-causal`` (the chain), ``sglang-mask`` (a tree
    through SGLang's custom-mask path), ``ddtree`` (DDTree's kernel)."""
    common = (inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"])

    def run() -> None:
        for L in inp["layers"]:
            if kind == "ddtree":
                rt.tree_verify_attention(L["q"], L["k"], L["v"], L["o"], L["k_buf"], L["v_buf"], *common, inp["mask"],
                                         inp["mask_indptr"], inp["scale"], inp["width"], splits=splits,
                                         impl="triton")
            else:
                masked = kind == "sglang-mask"
                sg(L["q"], L["k"], L["v"], L["o"], L["k_buf"], L["v_buf"], *common,
                   inp["mask"] if masked else None, True, inp["mask_indptr"] if masked else None, inp["width"],
                   1.0, 1.0, inp["scale"])
    return run


def wall_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def check(torch, rt, sg, inp: dict) -> dict:
    """DDTree's kernel against SGLang's custom-mask kernel (bf16 outputs, every layer) and against the float32
    reference (first layer)."""
    L = inp["layers"][0]
    common = (inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"])
    out = {}
    ours = L["o"].clone()
    rt.tree_verify_attention(L["q"], L["k"], L["v"], ours, L["k_buf"], L["v_buf"], *common, inp["mask"],
                             inp["mask_indptr"], inp["scale"], inp["width"], impl="triton")
    ref = torch.empty(L["o"].shape, dtype=torch.float32, device=L["o"].device)
    rt.tree_verify_attention(L["q"].float(), L["k"].float(), L["v"].float(), ref, L["k_buf"].float(),
                             L["v_buf"].float(), *common, inp["mask"], inp["mask_indptr"], inp["scale"], inp["width"],
                             impl="torch")
    out["ddtree_vs_fp32_ref"] = float((ours.float() - ref).abs().max())
    if sg is not None:
        theirs = L["o"].clone()
        sg(L["q"], L["k"], L["v"], theirs, L["k_buf"], L["v_buf"], *common, inp["mask"], True, inp["mask_indptr"],
           inp["width"], 1.0, 1.0, inp["scale"])
        out["ddtree_vs_sglang_mask"] = float((ours.float() - theirs.float()).abs().max())
        out["sglang_mask_vs_fp32_ref"] = float((theirs.float() - ref).abs().max())
    return out


def measure(torch, rt, sg, shapes: dict, batches, widths, context: int, smoke: bool, progress=print) -> list[dict]:
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    rows = []
    for key, shape in shapes.items():
        for bs in batches:
            for w in widths:
                inp = make_inputs(torch, shape, bs, w, context, device, dtype, gen)
                kinds = ["ddtree"] if sg is None else ["sglang-causal", "sglang-mask", "ddtree"]
                row = dict(shape=key, batch=bs, width=w, context=context, layers=shape["layers"])
                for kind in kinds:  # a variant that fails is recorded with its error; the others still run
                    try:
                        fn = variant_fn(kind, rt, sg, inp)
                        row[kind + "_ms"] = round(wall_ms(fn) if smoke else graph_us(fn) / 1000.0, 4)
                    except Exception as exc:  # noqa: BLE001
                        row[kind + "_error"] = f"{type(exc).__name__}: {exc}"[:300]
                row["splits"] = rt_plan(rt, bs, shape, w, device)["splits"]
                try:
                    row.update({k: round(v, 5) for k, v in check(torch, rt, sg, inp).items()})
                except Exception as exc:  # noqa: BLE001
                    row["check_error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                progress(json.dumps(row))
                del inp
                if not smoke:
                    torch.cuda.empty_cache()
    return rows


def rt_plan(rt, bs: int, shape: dict, width: int, device: str) -> dict:
    import importlib

    import torch

    mod = importlib.import_module(rt.__name__ + ".tree_attn_triton")
    return mod.plan(bs, shape["hq"], shape["hkv"], shape["d"], width, torch.device(device))


def markdown(result: dict) -> str:
    env = result["environment"]
    where = "CPU smoke run (tiny shapes, wall time)" if env["smoke"] else (
        f"{env['device']}, torch {env['torch']}, triton {env['triton']}, SGLang {env.get('sglang', 'not importable')}; "
        "bf16, every attention layer of one verify forward in one CUDA graph, CUDA events, median of 5 windows of "
        "10 replays")
    lines = ["# Verify attention per forward: SGLang's extend kernel (chain, custom mask) against DDTree's kernel", "",
             f"`{result['command']}` — {where}.", "",
             "`sglang-causal`: SGLang's triton extend kernel as the DFLASH chain runs it (causal, no mask); "
             "`sglang-mask`: the same kernel with a tree's custom mask (what DDTree ran before its own kernel); "
             "`ddtree`: DDTree's tree-verify kernel (query heads grouped per KV head, the context split "
             "`splits` ways). Differences are max abs over one layer's bf16 outputs.", ""]
    for key, shape in result["shapes"].items():
        lines += [f"## {shape['title']}, context {result['context']}", "",
                  "| batch | width | sglang-causal ms | sglang-mask ms | ddtree ms | ddtree / sglang-causal | "
                  "ddtree / sglang-mask | splits | ddtree vs sglang-mask | ddtree vs fp32 ref |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in result["rows"] if r["shape"] == key):
            c, m, t = r.get("sglang-causal_ms"), r.get("sglang-mask_ms"), r.get("ddtree_ms")
            lines.append(f"| {r['batch']} | {r['width']} | {c if c is not None else '-'} | "
                         f"{m if m is not None else '-'} | {t if t is not None else '-'} | "
                         f"{round(t / c, 3) if c and t else '-'} | {round(t / m, 3) if m and t else '-'} | "
                         f"{r['splits']} | {r.get('ddtree_vs_sglang_mask', '-')} | {r.get('ddtree_vs_fp32_ref', '-')} |")
            errors = [f"{k}: {v}" for k, v in r.items() if k.endswith("_error")]
            if errors:
                lines.append(f"| {r['batch']} | {r['width']} | failed: {'; '.join(errors)} |||||||||")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreted kernel, wall time)")
    ap.add_argument("--shapes", default=None, help=f"comma list of {', '.join(SHAPES)} (default: all)")
    ap.add_argument("--batches", default=None, help="batch sizes (default 1,8,32)")
    ap.add_argument("--widths", default=None, help="verify widths (default 16,17,65)")
    ap.add_argument("--context", type=int, default=None, help="context tokens per request (default 560)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results folder")
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    args = ap.parse_args(argv)
    import torch

    try:
        need_cuda(PROG, args.smoke)
        table = pick(SMOKE_SHAPES if args.smoke else SHAPES, args.shapes, "shapes", PROG)
        batches = ints(args.batches, "batches", PROG) if args.batches else ((1, 2) if args.smoke else (1, 8, 32))
        widths = ints(args.widths, "widths", PROG) if args.widths else ((3, 5) if args.smoke else WIDTHS)
    except BadArgs as exc:
        return refuse(exc)
    context = args.context if args.context is not None else (20 if args.smoke else 560)
    if context < 0:
        print("bench_verify_attention: --context must be >= 0", file=sys.stderr)
        return 2
    out = Path(args.out)
    if not out.is_dir():
        print(f"bench_verify_attention: --out {out}: no such folder", file=sys.stderr)
        return 2
    rt = load_runtime(args.smoke)
    sg = None if args.smoke else sglang_extend()
    if sg is None and not args.smoke:
        print("bench_verify_attention: SGLang's extend kernel is not importable here: timing DDTree's kernel only",
              file=sys.stderr)
    rows = measure(torch, rt, sg, table, batches, widths, context, args.smoke)
    import triton

    env = dict(torch=torch.__version__, triton=triton.__version__, python=platform.python_version(), smoke=args.smoke)
    if not args.smoke:
        env["device"] = torch.cuda.get_device_name(0)
        try:
            import sglang

            env["sglang"] = sglang.__version__
        except Exception:  # noqa: BLE001
            pass
    result = dict(command=" ".join([COMMAND] + (argv if argv is not None else sys.argv[1:])), environment=env,
                  context=context, shapes={k: dict(v) for k, v in table.items()}, rows=rows)
    stem = "verify-attention-smoke" if args.smoke else "verify-attention-" + env["device"].split()[-1].lower()
    stem += args.tag
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(result) + "\n")
    print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
