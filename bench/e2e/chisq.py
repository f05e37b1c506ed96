"""Temperature > 0 losslessness: test the output law of AR / DFlash chain / DDTree against the target's exact law.

Usage: python -m bench.e2e.chisq RAW_DIR_OR_TGZ [AGREE_TARGET_DIR] OUT_JSON
  Without AGREE_TARGET_DIR the weights come from the raw folder's models/agree-qwen3 (gpu_run.sh puts the served
  files there since call 4); older tarballs need the folder rebuilt with models/mk_models.py + models/mk_agree.py.

The agree target (bench/e2e/models/mk_agree.py) is exactly first order: o_proj and down_proj are zero, so the logits at
every step are W_lm . rmsnorm(E[previous token]) and the next-token law p(. | prev) is known in closed form from the
weights. For every generated token of the `sample-T` workload (16 requests per prompt seed, E2E_SAMPLE_REPS seeds, at
T=2.5, prompts rebuilt from their seeds) we add p(. | prev) into expected counts over 6 categories: the cycle successor of prev, another
cycle token, and the other tokens split by id % 4. A Pearson goodness-of-fit test per configuration (dof 5) then
asks whether the sampled tokens follow the target's law; AR is the control. A lossy verify (e.g. accepting draft
tokens that the target would not have sampled) shifts mass to the drafter's favourites and fails the test.
Also reported: a two-sample chi-square of the successor rate by position bucket against AR.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from scipy.stats import chi2, chi2_contingency

from bench.e2e.e2e_files import load_results, open_raw
from bench.e2e.workloads import CYCLE, NEXT, prompts, target_law

__all__ = ["analyse", "category", "target_law"]


def category(prev: int, tok: torch.Tensor) -> torch.Tensor:
    want = NEXT.get(prev, CYCLE[0])
    c = 2 + torch.remainder(tok, 4)
    is_cycle = torch.zeros_like(tok, dtype=torch.bool)
    for t in CYCLE:
        is_cycle |= tok == t
    c = torch.where(is_cycle, torch.ones_like(c), c)
    return torch.where(tok == want, torch.zeros_like(c), c)


def analyse(rs: dict, model_dir: Path) -> dict:
    """Goodness of fit of every configuration's `sample-T` tokens; AR (agree-ar) is the control when present."""
    temps = {rs[n]["workloads"]["sample-T"]["temperature"] for n in rs if "sample-T" in rs[n].get("workloads", {})}
    if len(temps) != 1:
        raise SystemExit(f"need one sampling temperature across configurations, got {sorted(temps)}")
    temperature = temps.pop()
    law = target_law(model_dir, temperature)
    V = law.shape[1]
    cat_of = torch.stack([category(p, torch.arange(V)) for p in range(V)])  # [prev, tok] -> category
    exp_by_prev = torch.zeros(V, 6, dtype=torch.float64)
    for c in range(6):
        exp_by_prev[:, c] = (law.double() * (cat_of == c)).sum(1)
    out = {"temperature": temperature,
           "categories": ["cycle successor", "other cycle token", "id%4==0", "id%4==1", "id%4==2", "id%4==3"],
           "tests": {}}
    base_follow = None
    for name in sorted(rs, key=lambda n: (n != "agree-ar", n)):
        w = rs[name].get("workloads", {}).get("sample-T")
        if not w:
            continue
        ps = sum((prompts(16, seed=s) for s in w["prompts_seeds"]), [])
        prev_l, cur_l, pos_l = [], [], []
        for p, o in zip(ps, w["output_ids"], strict=True):
            seq = [p[-1]] + o
            prev_l += seq[:-1]
            cur_l += seq[1:]
            pos_l += range(1, len(seq))
        prev, cur, pos = torch.tensor(prev_l), torch.tensor(cur_l), torch.tensor(pos_l)
        cats = cat_of[prev, cur]
        obs = torch.bincount(cats, minlength=6).double()
        exp = torch.bincount(prev, minlength=V).double() @ exp_by_prev
        bucket = (pos > 32).long() + (pos > 64).long()  # positions 1-32, 33-64, 65+
        follow = [[int(((bucket == b) & (cats == 0)).sum()), int(((bucket == b) & (cats != 0)).sum())]
                  for b in range(3)]
        stat = float(((obs - exp) ** 2 / exp).sum())
        r = {"tokens": int(obs.sum()), "observed": obs.tolist(), "expected": [round(x, 1) for x in exp.tolist()],
             "gof_chi2": round(stat, 3), "gof_dof": 5, "gof_p": round(float(chi2.sf(stat, 5)), 4),
             "successor_rate": round(float(obs[0] / obs.sum()), 4),
             "successor_rate_expected": round(float(exp[0] / exp.sum()), 4), "follow_by_position": follow}
        if name == "agree-ar":
            base_follow = follow
        elif base_follow is not None:
            a, b = sum(follow, []), sum(base_follow, [])
            keep = [i for i in range(len(a)) if a[i] + b[i] > 0]  # position buckets past the length are empty
            c2, p2, dof, _ = chi2_contingency([[a[i] for i in keep], [b[i] for i in keep]])
            r["vs_ar_two_sample"] = {"chi2": round(float(c2), 3), "dof": int(dof), "p": round(float(p2), 4)}
        v = sum((m.get("spec_verify_ct") or 0) for m in w["meta"])
        a = sum((m.get("spec_accepted_drafts") or 0) for m in w["meta"])
        r["accepted_per_round"] = round(a / v, 4) if v else None
        out["tests"][name] = r
    return out


def main() -> int:
    args = sys.argv[1:]
    if len(args) not in (2, 3):
        raise SystemExit(__doc__.split("\n\n")[1])
    raw = open_raw(Path(args[0]))
    model_dir = Path(args[1]) if len(args) == 3 else raw / "models" / "agree-qwen3"
    out = analyse(load_results(raw), model_dir)
    Path(args[-1]).write_text(json.dumps(out, indent=1))
    for n, r in out["tests"].items():
        print(f"{n:24s} tokens {r['tokens']} successor {r['successor_rate']} (law {r['successor_rate_expected']}) "
              f"GOF chi2 {r['gof_chi2']} p {r['gof_p']}  two-sample p {r.get('vs_ar_two_sample', {}).get('p')} "
              f"acc/round {r['accepted_per_round']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
