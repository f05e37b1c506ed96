"""GatedDeltaNet tree verify per layer at the Qwen3.6-27B shape: the chunk form (patches/ddtree/runtime/tree_chunk*)
against the recurrent form (tree_recurrent*: a state per node), one kernel at a time.

Shapes per GDN layer at TP 1: 16 key heads, 48 value heads, K = V = 128; bf16 activations, fp32 SSM state. Trees:
``chain`` (parents i-1, the shape of a DFlash chain verify: the recurrent form never reloads a state) and ``ddtree``
(a real tree from the runtime's builder, depth <= 15). Per (batch, N1, tree): median microseconds of CUDA-graph
replays (``triton.testing.do_bench_cudagraph``) of the verify kernel and of the commit (all of one layer), and the
bytes each form keeps per node. A kernel-level diagnostic, not a speed claim: the claims are the whole-round
tables of bench/e2e (hybrid_v2.sh), which time the real server. ``--dry`` runs tiny shapes through the CPU
interpreter (checks the script only).

Usage: python bench/bench_gdn_chunk.py [--out DIR] [--dry]   (writes DIR/gdn-chunk-<device>.{json,md})
"""
# ruff: noqa: B023 - the timed closures run inside the iteration that defines them
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--dry", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop starting new configurations after this long")
    ap.add_argument("--sweep", action="store_true",
                    help="time the chunk kernel's launch configurations (DDTREE_GDN_CHUNK) at a few shapes instead; "
                         "writes gdn-chunk-sweep-<device>.{json,md}")
    args = ap.parse_args()
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton.testing as tt

    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime

    rt = load_runtime(ROOT / "patches" / "ddtree" / "runtime", module_name="ddtree_runtime")
    tr = importlib.import_module("ddtree_runtime.tree_recurrent")
    tc = importlib.import_module("ddtree_runtime.tree_chunk")
    if not args.dry and not torch.cuda.is_available():
        print("no CUDA device (use --dry to try the script on CPU)")
        return 0
    dev = "cpu" if args.dry else "cuda"
    hk, hv, kd, vd = (1, 3, 16, 16) if args.dry else (16, 48, 128, 128)
    batches = [1, 2] if args.dry else [1, 8, 16]
    n1s = [5, 17] if args.dry else [17, 65, 129]
    gen = torch.Generator().manual_seed(0)
    name = "cpu-dry" if args.dry else torch.cuda.get_device_name().lower().replace("nvidia ", "").split()[0]
    meta = {"device": "cpu (interpreter, dry run)" if args.dry else torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "num_k_heads": hk, "num_v_heads": hv, "K": kd, "V": vd,
            "timing": "median microseconds per GDN layer, CUDA-graph replay (do_bench_cudagraph, rep=40 ms)",
            "state_bytes_per_node": hv * vd * kd * 4, "record_bytes_per_node": tc.per_node_record_bytes(hv, kd, vd)}
    rows = []
    if args.sweep:
        return sweep(args, rt, tr, tc, dev, (hk, hv, kd, vd), gen, name, meta)

    def bench(fn):
        if args.dry:
            t0 = time.time()
            fn()
            return (time.time() - t0) * 1e6
        return tt.do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3

    t_start = time.time()
    for batch in batches:
        for n1 in n1s:
            for kind in ("chain", "ddtree") if n1 == n1s[0] else ("ddtree",):
                if time.time() - t_start > args.budget_s:
                    meta["truncated"] = f"stopped after {args.budget_s} s"
                    break
                pc, q, k, v, g, beta, pool, slot = inputs(rt, kind, batch, n1, (hk, hv, kd, vd), dev, gen)
                slots = pool.shape[1]
                bf = torch.bfloat16
                anc = tc.tree_ancestors(pc)
                node_ssm = torch.empty(1, batch, n1, hv, vd, kd, device=dev)
                records = torch.empty(1, batch, n1, hv, rt.record_width(kd, vd), device=dev)
                conv_dummy = torch.zeros(1, slots, 8, 3, device=dev, dtype=bf)
                node_conv = torch.zeros(1, batch, n1, 8, 3, device=dev, dtype=bf)
                depth = 15
                path = torch.arange(depth + 1, device=dev).clamp(max=n1 - 1).expand(batch, depth + 1).contiguous()
                steps = torch.full((batch,), min(depth, n1 - 1), device=dev, dtype=torch.int64)
                last = torch.full((batch,), n1 - 1, device=dev, dtype=torch.int64)

                def rec():
                    tr.tree_gated_delta_rule(q, k, v, g, beta, pc, pool[0], slot, use_qk_l2norm=True,
                                             node_ssm=node_ssm[0], impl="triton")

                def chunk():
                    tc.tree_gated_delta_rule_chunk(q, k, v, g, beta, anc, pool[0], slot, use_qk_l2norm=True,
                                                   records=records[0], impl="triton")

                def commit_rec():
                    tr.commit_tree_states_layers(pool, conv_dummy, node_ssm, node_conv, last, slot, impl="triton")

                def commit_chunk():
                    tc.commit_tree_records_layers(pool, records, path, steps, slot, slot, impl="triton")

                def anc_fn():
                    tc.tree_ancestors(pc)

                for f in (rec, chunk, commit_rec, commit_chunk, anc_fn):
                    f()  # compile outside the timed region
                if not args.dry:
                    torch.cuda.synchronize()
                # agreement of the two forms on this input (outputs, bf16)
                o_r, _ = tr.tree_gated_delta_rule(q, k, v, g, beta, pc, pool[0], slot, use_qk_l2norm=True,
                                                  node_ssm=node_ssm[0], impl="triton")
                o_c, _ = tc.tree_gated_delta_rule_chunk(q, k, v, g, beta, anc, pool[0], slot, use_qk_l2norm=True,
                                                        records=records[0], impl="triton")
                diff = float((o_r.float() - o_c.float()).abs().max() / (o_r.float().abs().max() + 1e-6))
                t = {n: bench(f) for n, f in (("recurrent_us", rec), ("chunk_us", chunk),
                                              ("commit_recurrent_us", commit_rec),
                                              ("commit_chunk_us", commit_chunk), ("ancestors_us", anc_fn))}
                row = {"B": batch, "N1": n1, "tree": kind, **{k2: round(v2, 2) for k2, v2 in t.items()},
                       "chunk_vs_recurrent": round(t["chunk_us"] / t["recurrent_us"], 3), "out_rel_diff": diff}
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gdn-chunk-{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = [f"# GatedDeltaNet tree verify per layer, chunk vs recurrent form ({meta['device']})", "",
          f"Qwen3.6-27B GDN shape ({hk} key / {hv} value heads, K = V = {kd}); {meta['timing']}. Kept per node and "
          f"layer: a state {meta['state_bytes_per_node'] / 2**20:.2f} MiB (recurrent) vs a record "
          f"{meta['record_bytes_per_node'] / 2**10:.1f} KiB (chunk). Commit: one layer, a path of 16 nodes "
          "(chunk) / a copy of one node (recurrent). A kernel diagnostic; the speed claims are bench/e2e's.",
          "", "Reproduce: `python bench/bench_gdn_chunk.py` on the GPU.", "",
          "| B | N1 | tree | recurrent us | chunk us | chunk / recurrent | commit rec us | commit chunk us |"
          " ancestors us | out rel diff |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['B']} | {r['N1']} | {r['tree']} | {r['recurrent_us']:.1f} | {r['chunk_us']:.1f} | "
                  f"{r['chunk_vs_recurrent']:.3f} | {r['commit_recurrent_us']:.1f} | {r['commit_chunk_us']:.1f} | "
                  f"{r['ancestors_us']:.1f} | {r['out_rel_diff']:.1e} |")
    if meta.get("truncated"):
        md += ["", f"Truncated: {meta['truncated']}."]
    (out / f"gdn-chunk-{name}.md").write_text("\n".join(md) + "\n")
    return 0


def inputs(rt, kind: str, batch: int, n1: int, heads: tuple, dev, gen) -> tuple:
    """One configuration's tree and GDN inputs: parents on ``dev`` (``chain``: parents i-1; ``ddtree``: the runtime's
    builder on random draft logits, depth <= 15), bf16 q / k / v, decays and betas, a one-layer state pool
    [1, batch + 2, HV, V, K] and the requests' distinct slots."""
    import torch

    hk, hv, kd, vd = heads
    if kind == "chain":
        parent = torch.tensor([[-1] + list(range(n1 - 1))] * batch, dtype=torch.int32)
    else:
        logits = torch.randn(batch, 15, 256, generator=gen) * 3.0
        lp, tok = rt.draft_topk(logits, min(n1 - 1, 256), impl="torch")
        parent = rt.build_tree(lp, tok, torch.randint(0, 256, (batch,), generator=gen), n1 - 1, impl="torch").parent
    bf = torch.bfloat16
    q = torch.randn(batch, n1, hk, kd, device=dev, dtype=bf)
    k = torch.randn(batch, n1, hk, kd, device=dev, dtype=bf)
    v = torch.randn(batch, n1, hv, vd, device=dev, dtype=bf)
    g = -torch.rand(batch, n1, hv, device=dev) * 0.3
    beta = torch.rand(batch, n1, hv, device=dev)
    pool = torch.randn(1, batch + 2, hv, vd, kd, device=dev) * 0.1
    slot = torch.randperm(batch + 2)[:batch].to(dev).to(torch.int32)
    return parent.to(dev), q, k, v, g, beta, pool, slot


def sweep(args, rt, tr, tc, dev, heads, gen, name, meta) -> int:
    """Every launch configuration at bs 1/16 x N1 17/65 (real DDTree trees): the chunk verify's microseconds, and
    its parts (the decay matmul, the triangle kernel) for the default configuration."""
    import itertools

    import torch
    import triton.testing as tt

    hk, hv, kd, vd = heads
    shapes = [(1, 5), (2, 17)] if args.dry else [(1, 17), (1, 65), (16, 17), (16, 65)]
    grid = list(itertools.product(["ieee", "tf32x3"], [2, 4, 8], [16, 32, 64]))
    if args.dry:
        grid = grid[:2]
    bench = (lambda fn: (lambda t0: (fn(), (time.time() - t0) * 1e6)[1])(time.time())) if args.dry else (
        lambda fn: tt.do_bench_cudagraph(fn, rep=25, return_mode="median") * 1e3)
    rows, t_start = [], time.time()
    for batch, n1 in shapes:
        pc, q, k, v, g, beta, pools, slot = inputs(rt, "ddtree", batch, n1, heads, dev, gen)
        pool = pools[0]
        anc = tc.tree_ancestors(pc)
        records = torch.empty(batch, n1, hv, rt.record_width(kd, vd), device=dev)
        node_ssm = torch.empty(batch, n1, hv, vd, kd, device=dev)
        o_r, _ = tr.tree_gated_delta_rule(q, k, v, g, beta, pc, pool, slot, use_qk_l2norm=True, node_ssm=node_ssm,
                                          impl="triton")
        rec_us = bench(lambda: tr.tree_gated_delta_rule(q, k, v, g, beta, pc, pool, slot, use_qk_l2norm=True,
                                                        node_ssm=node_ssm, impl="triton"))
        gsum_us = bench(lambda: torch.bmm(anc.to(torch.float32), g))
        for prec, warps, bv in grid:
            if time.time() - t_start > args.budget_s:
                meta["truncated"] = f"stopped after {args.budget_s} s"
                break
            os.environ["DDTREE_GDN_CHUNK"] = f"prec={prec},warps={warps},bv={bv}"

            def chunk():
                tc.tree_gated_delta_rule_chunk(q, k, v, g, beta, anc, pool, slot, use_qk_l2norm=True,
                                               records=records, impl="triton")
            try:
                chunk()
                o_c, _ = tc.tree_gated_delta_rule_chunk(q, k, v, g, beta, anc, pool, slot, use_qk_l2norm=True,
                                                        records=records, impl="triton")
                us = bench(chunk)
                diff = float((o_r.float() - o_c.float()).abs().max() / (o_r.float().abs().max() + 1e-6))
                row = {"B": batch, "N1": n1, "prec": prec, "warps": warps, "bv": bv, "chunk_us": round(us, 2),
                       "recurrent_us": round(rec_us, 2), "gsum_us": round(gsum_us, 2),
                       "vs_recurrent": round(us / rec_us, 3), "out_rel_diff": diff}
            except Exception as e:  # noqa: BLE001 - a configuration that does not compile is recorded as such
                row = {"B": batch, "N1": n1, "prec": prec, "warps": warps, "bv": bv, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.environ.pop("DDTREE_GDN_CHUNK", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    best = {}
    for r in rows:
        key = f"B{r['B']}-N{r['N1']}"
        if "chunk_us" in r and (key not in best or r["chunk_us"] < best[key]["chunk_us"]):
            best[key] = r
    (out / f"gdn-chunk-sweep-{name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "best": best}, indent=1))
    md = [f"# Chunk-form GDN verify: launch configurations ({meta['device']})", "",
          "Median microseconds per GDN layer (CUDA-graph replay), Qwen3.6-27B GDN shape, real DDTree trees; the "
          "recurrent form and the decay matmul on the same input for reference. Reproduce: "
          "`python bench/bench_gdn_chunk.py --sweep`.", "",
          "| B | N1 | prec | warps | BV | chunk us | recurrent us | chunk / rec | gsum us | out rel diff |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "chunk_us" in r:
            md.append(f"| {r['B']} | {r['N1']} | {r['prec']} | {r['warps']} | {r['bv']} | {r['chunk_us']:.1f} | "
                      f"{r['recurrent_us']:.1f} | {r['vs_recurrent']:.3f} | {r['gsum_us']:.1f} | {r['out_rel_diff']:.1e} |")
        else:
            md.append(f"| {r['B']} | {r['N1']} | {r['prec']} | {r['warps']} | {r['bv']} | error: {r['error'][:80]} |"
                      " | | | |")
    md += ["", "Best per shape: " + "; ".join(f"{k}: {v['prec']} / {v['warps']} warps / BV {v['bv']} "
                                              f"({v['chunk_us']:.1f} us)" for k, v in best.items())]
    (out / f"gdn-chunk-sweep-{name}.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
