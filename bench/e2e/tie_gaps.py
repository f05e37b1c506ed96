"""Explain greedy divergences on the random tiny model: the logit gap at the first divergent token.

Usage: python -m bench.e2e.tie_gaps RAW_DIR_OR_TGZ MODELS_DIR OUT_JSON
For every rand-* configuration and workload where the output differs from rand-ar, recompute in float32 (HF
transformers, same weights as served) the target's logits at the first divergent position, given the AR prefix, and
report the top-3 logits and the gap between the AR token and the speculative token. A gap of the order of one bf16
ulp at that magnitude (~2e-3 near 0.4) is a numerical near-tie between two kernels, not a verify bug.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from bench.e2e.e2e_files import load_results
from bench.e2e.workloads import prompts


def main() -> int:
    rs = load_results(Path(sys.argv[1]), "rand-*.json")
    m = Qwen3ForCausalLM.from_pretrained(str(Path(sys.argv[2]) / "tiny-qwen3"), torch_dtype=torch.float32).eval()
    P = prompts(16)
    out = []
    ar = rs["rand-ar"]["workloads"]
    for name in sorted(rs):
        if name == "rand-ar" or not rs[name].get("ok"):
            continue
        for wl, w in rs[name]["workloads"].items():
            if not wl.startswith("greedy"):
                continue
            for i, (a, b) in enumerate(zip(w["output_ids"], ar[wl]["output_ids"], strict=True)):
                k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
                if k is None:
                    continue
                with torch.no_grad():
                    lg = m(torch.tensor([P[i] + b[:k]])).logits[0, -1]
                top = lg.topk(3)
                out.append({"config": name, "workload": wl, "request": i, "position": k, "ar_token": b[k],
                            "spec_token": a[k], "fp32_top3": top.indices.tolist(),
                            "fp32_top3_logits": [round(v, 5) for v in top.values.tolist()],
                            "gap_ar_minus_spec": float(lg[b[k]] - lg[a[k]]),
                            "fp32_argmax_is": "ar" if int(top.indices[0]) == b[k] else
                            "spec" if int(top.indices[0]) == a[k] else "neither"})
    Path(sys.argv[3]).write_text(json.dumps(out, indent=1))
    gaps = [abs(o["gap_ar_minus_spec"]) for o in out]
    print(len(out), "divergences; max |gap|", max(gaps) if gaps else None,
          "fp32 argmax sides", {s: sum(o["fp32_argmax_is"] == s for o in out) for s in ("ar", "spec", "neither")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
