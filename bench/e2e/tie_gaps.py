"""Explain greedy divergences: the logit gap at the first divergent token, recomputed off the GPU in float32/64.

Usage: python -m bench.e2e.tie_gaps RAW_DIR_OR_TGZ MODELS_DIR OUT_JSON [--set rand|hyblive]
For every configuration of the set and workload where the output differs from the set's reference, recompute (HF
transformers, same weights as served) the target's logits at the first divergent position, given the reference's
prefix, and report the top-3 logits and the gap between the reference token and the speculative token. A gap of the
order of one bf16 ulp at that magnitude (~2e-3 near 0.4) is a numerical near-tie between two kernels, not a verify bug.

`--set rand` (default): the random tiny Qwen3 pair, reference `rand-ar`, float32.
`--set hyblive` (issue #15): the hybrid GatedDeltaNet target of models/mk_hybrid_live.py (MODELS_DIR/live-next; the script
is deterministic, so it can be remade off the GPU), reference the stock V2 chain `hyblive-chain`, float64. It also
writes, per configuration, every position where the configuration's own output (teacher-forced) is not the float64
argmax and the gap there (`self_misses`): a state defect (a wrong slot, a stale or foreign state) gives misses at
ordinary gaps and a tail that stops following the model; kernel rounding gives misses at near-ties only, in every
configuration alike. And whether each request's output is the same at every batch size (`batch_invariant`): a
per-request indexing defect shows up as outputs that depend on the batch a request runs in.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.e2e.e2e_files import load_results
from bench.e2e.workloads import prompts

#: set -> (result glob, reference configuration, model folder under MODELS_DIR, dtype)
SETS = {"rand": ("rand-*.json", "rand-ar", "tiny-qwen3", torch.float32),
        "hyblive": ("hyblive-*.json", "hyblive-chain", "live-next", torch.float64)}


def load_model(path: Path, dtype: torch.dtype):
    """The served weights in `dtype`; MoE experts through the eager loop (the grouped-mm path takes no float64)."""
    from transformers import AutoModelForCausalLM

    kw = {"experts_implementation": "eager"} if "next" in path.name else {}
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw).eval()


def continuation_logits(m, prompt: list[int], out: list[int]) -> torch.Tensor:
    """[len(out), V]: row k = the logits that predict out[k] given prompt + out[:k] (one teacher-forced forward)."""
    with torch.no_grad():
        return m(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1]


def first_divergences(rs: dict, ref: str, m, P: list[list[int]]) -> list[dict]:
    out = []
    base = rs[ref]["workloads"]
    for name in sorted(rs):
        if name == ref or not rs[name].get("ok"):
            continue
        for wl, w in rs[name]["workloads"].items():
            if not wl.startswith("greedy") or wl not in base:
                continue
            for i, (a, b) in enumerate(zip(w["output_ids"], base[wl]["output_ids"], strict=True)):
                k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
                if k is None:
                    continue
                lg = continuation_logits(m, P[i], b)[k]
                top = lg.topk(3)
                out.append({"config": name, "workload": wl, "request": i, "position": k, "ar_token": b[k],
                            "spec_token": a[k], "fp32_top3": top.indices.tolist(),
                            "fp32_top3_logits": [round(v, 5) for v in top.values.tolist()],
                            "gap_ar_minus_spec": float(lg[b[k]] - lg[a[k]]),
                            "fp32_argmax_is": "ar" if int(top.indices[0]) == b[k] else
                            "spec" if int(top.indices[0]) == a[k] else "neither"})
    return out


def self_misses(rs: dict, m, P: list[list[int]], workload: str) -> dict:
    """Per configuration: its own output teacher-forced; where a token is not the argmax, (request, position, gap),
    and the top-2 gap distribution over all its positions."""
    res = {}
    for name in sorted(rs):
        w = rs[name]["workloads"].get(workload) if rs[name].get("ok") else None
        if w is None:
            continue
        miss, gaps = [], []
        for i, o in enumerate(w["output_ids"]):
            lg = continuation_logits(m, P[i], o)
            top = lg.topk(2)
            gaps += (top.values[:, 0] - top.values[:, 1]).tolist()
            miss += [[i, k, round(float(top.values[k, 0] - lg[k, t]), 5)]
                     for k, t in enumerate(o) if int(top.indices[k, 0]) != t]
        gaps.sort()
        res[name] = {"tokens": len(gaps), "misses": miss, "max_miss_gap": max((g for *_, g in miss), default=None),
                     "top2_gap_median": gaps[len(gaps) // 2], "top2_gap_p5": gaps[len(gaps) // 20]}
    return res


def batch_invariant(rs: dict) -> dict:
    """Per configuration: is request i's output the same in every greedy batch it ran in?"""
    res = {}
    for name, d in sorted(rs.items()):
        wls = {int(k.split("bs")[1]): w["output_ids"] for k, w in d.get("workloads", {}).items()
               if k.startswith("greedy-bs")}
        if wls:
            big = wls[max(wls)]
            res[name] = all(outs == big[:len(outs)] for outs in wls.values())
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("models", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--set", choices=sorted(SETS), default="rand")
    a = ap.parse_args()
    glob, ref, model, dtype = SETS[a.set]
    rs = load_results(a.raw, glob)
    m = load_model(a.models / model, dtype)
    P = prompts(16)
    out = first_divergences(rs, ref, m, P)
    doc: object = out
    if a.set == "hyblive":
        workload = max((k for k in rs[ref]["workloads"] if k.startswith("greedy-bs")), key=lambda k: int(k[9:]))
        doc = {"reference": ref, "dtype": str(dtype), "first_divergences": out,
               "self_misses": self_misses(rs, m, P, workload), "self_misses_workload": workload,
               "batch_invariant": batch_invariant(rs)}
    a.out.write_text(json.dumps(doc, indent=1))
    gaps = [abs(o["gap_ar_minus_spec"]) for o in out]
    print(len(out), "divergences; max |gap|", max(gaps) if gaps else None,
          "fp32 argmax sides", {s: sum(o["fp32_argmax_is"] == s for o in out) for s in ("ar", "spec", "neither")})
    if isinstance(doc, dict):
        for name, s in doc["self_misses"].items():
            print(f"{name}: {len(s['misses'])}/{s['tokens']} tokens not the argmax, max gap {s['max_miss_gap']}, "
                  f"top-2 gap median {s['top2_gap_median']:.3f}; batch invariant {doc['batch_invariant'].get(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
