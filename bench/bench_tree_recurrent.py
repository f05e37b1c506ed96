"""Hybrid verify cost of the recurrent layers: DDTree tree vs DFlash chain at equal token count.

Per recurrent (GatedDeltaNet) layer and verify step: tree causal conv1d + tree gated delta rule over B requests
of N1 nodes each (the kernels of patches/ddtree/runtime/tree_recurrent_triton.py), then the batched commit.
Shapes: H = HV = 16 heads, K = V = 128 (as the task asks; Qwen3-Next-80B itself has 32 value heads, which
doubles the state traffic), conv dim = 2*H*K + HV*V = 6144, K_conv = 4, bf16 activations, fp32 SSM states,
bf16 conv states. Trees:
  chain  parents i-1 (what a DFlash chain verify does; the running state never leaves registers)
  ddtree a real DDTree tree from the runtime's builder (random draft logits, depth limit 15)
  wide   every node a child of the root (worst case: every node reloads its parent's state)
Timings are medians of CUDA-graph replays (``triton.testing.do_bench_cudagraph``), so launch overhead is what a
captured decode step would pay. ``--dry`` runs tiny shapes through the CPU interpreter (checks the script only;
its numbers mean nothing).

Usage: python bench/bench_tree_recurrent.py [--out DIR] [--dry]
Writes DIR/tree-recurrent-<device>.json and .md (default DIR: bench/results).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_DIR = ROOT / "patches" / "ddtree" / "runtime"
sys.path.insert(0, str(ROOT))


def load_runtime(name: str = "ddtree_runtime"):
    """The runtime package (by path, as overlays vendor it) and its tree_recurrent module."""
    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime as load_runtime_dir

    return load_runtime_dir(RUNTIME_DIR, module_name=name), importlib.import_module(f"{name}.tree_recurrent")


def make_parents(rt, kind: str, batch: int, n1: int, gen):
    import torch
    if kind == "chain":
        row = [-1] + list(range(n1 - 1))
        return torch.tensor([row] * batch, dtype=torch.int32)
    if kind == "wide":
        return torch.tensor([[-1] + [0] * (n1 - 1)] * batch, dtype=torch.int32)
    logits = torch.randn(batch, 15, 256, generator=gen) * 3.0
    lp, tok = rt.draft_topk(logits, min(n1 - 1, 256), impl="torch")
    roots = torch.randint(0, 256, (batch,), generator=gen)
    return rt.build_tree(lp, tok, roots, n1 - 1, impl="torch").parent


def tree_stats(parent):
    import torch
    n1 = parent.shape[1]
    idx = torch.arange(n1)
    reload = ((parent != idx - 1) & (idx > 0)).sum(1).float().mean().item()  # nodes that reload a state
    depth = torch.zeros_like(parent)
    for i in range(1, n1):
        p = parent[:, i].long()
        depth[:, i] = torch.where(p >= 0, depth.gather(1, p.clamp(min=0)[:, None])[:, 0] + 1, 0)
    return {"mean_reloads": round(reload, 2), "max_depth": int(depth.max())}


def measure(tr, parent, bench, dev, H, HV, KD, VD, DIM, KC, dry):
    """Time one configuration: (conv, gdn, conv+gdn, commit) in microseconds, plus bytes of kept states."""
    import torch
    batch, n1 = parent.shape
    slots = batch + 3
    bf = torch.bfloat16
    q = torch.randn(batch, n1, H, KD, device=dev, dtype=bf)
    k = torch.randn(batch, n1, H, KD, device=dev, dtype=bf)
    v = torch.randn(batch, n1, HV, VD, device=dev, dtype=bf)
    g = -torch.rand(batch, n1, HV, device=dev) * 0.3
    beta = torch.rand(batch, n1, HV, device=dev)
    h0 = torch.randn(slots, HV, VD, KD, device=dev) * 0.1
    x = torch.randn(batch, n1, DIM, device=dev, dtype=bf)
    cs = torch.randn(slots, KC - 1, DIM, device=dev, dtype=bf).transpose(1, 2)  # SGLang strides
    w = torch.randn(DIM, KC, device=dev, dtype=bf)
    bias = torch.randn(DIM, device=dev, dtype=bf)
    slot = torch.randperm(slots)[:batch].to(dev)
    pc = parent.to(dev)
    node_ssm = torch.empty(batch, n1, HV, VD, KD, device=dev)
    node_conv = torch.empty(batch, n1, DIM, KC - 1, device=dev, dtype=bf)
    acc = torch.randint(0, n1, (batch,)).to(dev)

    def conv():
        tr.tree_causal_conv1d(x, pc, cs, slot, w, bias, "silu", node_conv=node_conv, impl="triton")

    def gdn():
        tr.tree_gated_delta_rule(q, k, v, g, beta, pc, h0, slot, use_qk_l2norm=True, node_ssm=node_ssm,
                                 impl="triton")

    def both():
        conv()
        gdn()

    def commit():
        tr.commit_tree_states(h0, cs, node_ssm, node_conv, acc, slot, impl="triton")

    both()  # compile outside the timed region
    commit()
    if not dry:
        torch.cuda.synchronize()
    times = [bench(f) * 1e3 for f in (conv, gdn, both, commit)]
    return times, node_ssm.numel() * 4 + node_conv.numel() * 2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--dry", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new configs after this long")
    args = ap.parse_args()
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton.testing as tt

    rt, tr = load_runtime()
    dev = "cpu" if args.dry else "cuda"
    if not args.dry and not torch.cuda.is_available():
        print("no CUDA device (use --dry to try the script on CPU)")
        return 0
    H = HV = 2 if args.dry else 16
    KD = VD = 16 if args.dry else 128
    DIM = 2 * H * KD + HV * VD
    KC = 4
    batches = [1, 2] if args.dry else [1, 8, 32]
    n1s = [4, 8] if args.dry else [16, 64]
    kinds = ["chain", "ddtree", "wide"]
    gen = torch.Generator()
    gen.manual_seed(0)
    name = "cpu-dry" if args.dry else torch.cuda.get_device_name().lower().replace("nvidia ", "").split()[0]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"device": "cpu (interpreter, dry run)" if args.dry else torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "H": H, "HV": HV, "K": KD, "V": VD, "conv_dim": DIM, "K_conv": KC,
            "activations": "bf16", "ssm_state": "fp32", "conv_state": "bf16",
            "timing": "median microseconds per layer per verify step, CUDA-graph replay (do_bench_cudagraph)",
            "per_node_state_bytes_per_layer": tr.per_node_state_bytes(HV, KD, VD, DIM, KC, torch.float32,
                                                                      torch.bfloat16)}
    rows = []
    t_start = time.time()

    def bench(fn):
        if args.dry:
            t0 = time.time()
            fn()
            return (time.time() - t0) * 1e3
        return tt.do_bench_cudagraph(fn, rep=30, return_mode="median")

    def write():
        (out_dir / f"tree-recurrent-{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        md = [f"# Tree recurrent-state kernels: verify cost per GDN layer ({meta['device']})", "",
              f"H=HV={H}, K=V={KD}, conv_dim={DIM}, K_conv={KC}; bf16 activations, fp32 SSM state, bf16 conv state; "
              f"{meta['timing']}. Per node and layer the kept states cost "
              f"{meta['per_node_state_bytes_per_layer'] / 2**20:.3f} MiB.", "",
              "| B | N1 | tree | mean reloads | max depth | conv us | gdn us | verify us | vs chain | commit us |"
              " states MiB written | GB/s (states) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['B']} | {r['N1']} | {r['tree']} | {r['mean_reloads']} | {r['max_depth']} | "
                      f"{r['conv_us']:.1f} | {r['gdn_us']:.1f} | {r['verify_us']:.1f} | {r['vs_chain']:.3f} | "
                      f"{r['commit_us']:.1f} | {r['state_mib']:.1f} | {r['state_gbps']:.0f} |")
        (out_dir / f"tree-recurrent-{name}.md").write_text("\n".join(md) + "\n")

    for batch in batches:
        for n1 in n1s:
            chain_us = None
            for kind in kinds:
                if time.time() - t_start > args.budget_s:
                    meta["truncated"] = f"stopped after {args.budget_s}s; remaining configs not run"
                    write()
                    print(meta["truncated"])
                    return 0
                parent = make_parents(rt, kind, batch, n1, gen)
                st = tree_stats(parent)
                (conv_us, gdn_us, verify_us, commit_us), state_bytes = measure(
                    tr, parent, bench, dev, H, HV, KD, VD, DIM, KC, args.dry)
                if kind == "chain":
                    chain_us = verify_us
                row = {"B": batch, "N1": n1, "tree": kind, **st, "conv_us": conv_us, "gdn_us": gdn_us,
                       "verify_us": verify_us, "vs_chain": verify_us / chain_us, "commit_us": commit_us,
                       "state_mib": state_bytes / 2**20, "state_gbps": state_bytes / (verify_us * 1e-6) / 1e9}
                rows.append(row)
                print(json.dumps(row), flush=True)
                write()
    # memory limit numbers for the docs: Qwen3-Next-80B (36 GDN layers, HV=32) with 40 GiB for states
    meta["qwen3_next_80b_max_budget_40GiB"] = {
        str(b): tr.max_budget_for_memory(40 * 2**30, 32, 128, 128, 8192, 4, torch.float32, num_layers=36, batch=b,
                                         conv_dtype=torch.bfloat16) for b in (1, 8, 32)}
    write()
    print(json.dumps(meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
