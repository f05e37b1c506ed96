"""Temperature > 0 losslessness: compare the output law of DDTree / DFlash chain with autoregressive sampling.

Usage: python bench/e2e/chisq.py RAW_DIR_OR_TGZ OUT_JSON
Reads the `sample-T` workload of the agree-* configurations (bench/e2e/mk_agree.py target at T=2.5: after each
token the target continues its cycle C0->C1->C2->C3 with probability ~0.54 and spreads the rest over the other
tokens). Two-sample chi-square tests against agree-ar on
  (1) follow / not-follow counts of each token's predecessor rule, split by position bucket (0-31, 32-63, 64-127);
  (2) the next-token category: next cycle token / other cycle token / non-cycle token, split by whether the
      previous token was a cycle token.
A lossy verify (e.g. greedy acceptance of draft tokens at T > 0) raises the follow rate; both tests catch it.
"""
from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

from scipy.stats import chi2_contingency

CYCLE = [100, 101, 102, 103]
NEXT = {CYCLE[i]: CYCLE[(i + 1) % 4] for i in range(4)}


def load(src: Path) -> dict:
    if src.is_file():
        td = Path(tempfile.mkdtemp())
        with tarfile.open(src) as t:
            t.extractall(td)
        src = td
    return {json.loads(f.read_text())["config"]["name"]: json.loads(f.read_text()) for f in src.glob("*.json")
            if "config" in json.loads(f.read_text())}


def tables(outs: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    follow = [[0, 0] for _ in range(3)]  # per position bucket: [follow, not]
    cat = [[0, 0, 0], [0, 0, 0]]  # prev is cycle / not: [next-cycle, other-cycle, non-cycle]
    for o in outs:
        for i in range(1, len(o)):
            prev, cur = o[i - 1], o[i]
            want = NEXT.get(prev, CYCLE[0])
            b = 0 if i < 32 else 1 if i < 64 else 2
            follow[b][0 if cur == want else 1] += 1
            c = 0 if cur == want else 1 if cur in NEXT else 2
            cat[0 if prev in NEXT else 1][c] += 1
    return follow, cat


def main() -> int:
    rs = load(Path(sys.argv[1]))
    base = rs["agree-ar"]["workloads"]["sample-T"]["output_ids"]
    fb, cb = tables(base)
    out = {"temperature": rs["agree-ar"]["workloads"]["sample-T"]["temperature"], "baseline": "agree-ar",
           "baseline_tables": {"follow_by_position": fb, "category_by_prev": cb}, "tests": {}}
    for name, d in sorted(rs.items()):
        if name == "agree-ar" or "sample-T" not in d.get("workloads", {}):
            continue
        w = d["workloads"]["sample-T"]
        f, c = tables(w["output_ids"])
        res = {"tokens": sum(len(o) for o in w["output_ids"]), "follow_by_position": f, "category_by_prev": c}
        for key, a, b in (("follow", f, fb), ("category_prev_cycle", [c[0]], [cb[0]]),
                          ("category_prev_other", [c[1]], [cb[1]])):
            rows = [r for r in a] + [r for r in b]
            cols = [j for j in range(len(rows[0])) if sum(r[j] for r in rows) > 0]
            rows = [[r[j] for j in cols] for r in rows]
            if key == "follow":
                # 2 (config) x 2 (follow) per position bucket, pooled as a 2 x 6 table
                rows = [sum(a, []), sum(b, [])]
            chi2, p, dof, _ = chi2_contingency(rows)
            res[key] = {"chi2": round(float(chi2), 3), "dof": int(dof), "p": round(float(p), 4)}
        total_f = sum(r[0] for r in f) / max(1, sum(sum(r) for r in f))
        total_b = sum(r[0] for r in fb) / max(1, sum(sum(r) for r in fb))
        res["follow_rate"] = round(total_f, 4)
        res["baseline_follow_rate"] = round(total_b, 4)
        v = sum((m.get("spec_verify_ct") or 0) for m in w["meta"])
        a = sum((m.get("spec_accepted_drafts") or 0) for m in w["meta"])
        res["accepted_per_round"] = round(a / v, 4) if v else None
        out["tests"][name] = res
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
    for n, r in out["tests"].items():
        print(n, "follow", r["follow_rate"], "vs AR", r["baseline_follow_rate"], "p(follow)", r["follow"]["p"],
              "p(cat|cycle)", r["category_prev_cycle"]["p"], "p(cat|other)", r["category_prev_other"]["p"],
              "acc/round", r["accepted_per_round"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
