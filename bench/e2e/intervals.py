"""Speed ratios with 95 % intervals, from the e2e driver's raw results (the measurement protocol of bench/e2e/README.md).

Each timed cell (a configuration at one batch size) holds its reps (``workloads["speed-bsN"]``: one generate call of
``tokens`` output tokens per request, ``seconds`` of wall time, ``rounds`` verify rounds). tok/s is pooled over the
reps: total tokens / total seconds. The ratio of a configuration to the reference (the stock chain) is the ratio of
the pooled tok/s; its 95 % interval comes from a bootstrap over reps (each cell's reps resampled with replacement,
independently, 20,000 times, seed 0; the 2.5th and 97.5th percentiles). ``round_cost_vs_ref`` is the ratio of
pooled seconds per verify round (the inverse interval when both accept the same tokens per round, as random weights
do). A target is judged at the unfavourable end of its interval: ``--target-max X`` marks a round-cost claim met
only when the interval's upper end is at most X.

Usage: python -m bench.e2e.intervals STEM --ref CONFIG RAW [RAW ...] [--configs A,B] [--target-max X]
  RAW: TAG-raw.tgz files or result folders (later ones win for a configuration of the same name);
  writes STEM.json (rows: config, batch, reps, tok_s, ref_tok_s, ratio_vs_ref, ratio_ci_low, ratio_ci_high,
  round_ms, round_cost_vs_ref, round_cost_ci_low, round_cost_ci_high, met) and STEM.md.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from .e2e_files import load_results

RESAMPLES = 20_000


def load_cells(raws: list[Path]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """config -> batch -> its reps, from result JSONs in tarballs or folders (later files win)."""
    cells: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for raw in raws:
        for name, doc in load_results(raw).items():
            by_batch = {}
            for workload, runs in (doc.get("workloads") or {}).items():
                m = re.fullmatch(r"speed-bs(\d+)", workload)
                if m and isinstance(runs, list) and runs:
                    by_batch[int(m.group(1))] = runs
            if by_batch:
                cells[name] = by_batch
    return cells


def _arrays(runs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.array([float(r["tokens"]) for r in runs])  # all requests of the call together
    seconds = np.array([float(r["seconds"]) for r in runs])
    rounds = np.array([float(r.get("rounds") or 0) for r in runs])
    return tokens, seconds, rounds


def pooled_tok_s(runs: list[dict[str, Any]]) -> float:
    tokens, seconds, _ = _arrays(runs)
    return float(tokens.sum() / seconds.sum())


def ratio_interval(a: list[dict[str, Any]], b: list[dict[str, Any]], *, resamples: int = RESAMPLES,
                   seed: int = 0) -> dict[str, float]:
    """Pooled tok/s of ``a`` over ``b`` and the pooled seconds-per-round of ``a`` over ``b``, each with its 95 %
    bootstrap interval over reps."""
    rng = np.random.default_rng(seed)
    ta, sa, ra = _arrays(a)
    tb, sb, rb = _arrays(b)
    ia = rng.integers(0, len(a), size=(resamples, len(a)))
    ib = rng.integers(0, len(b), size=(resamples, len(b)))
    tok = (ta[ia].sum(1) / sa[ia].sum(1)) / (tb[ib].sum(1) / sb[ib].sum(1))
    out = {"ratio": float((ta.sum() / sa.sum()) / (tb.sum() / sb.sum())),
           "ci_low": float(np.percentile(tok, 2.5)), "ci_high": float(np.percentile(tok, 97.5))}
    if ra.all() and rb.all():
        cost = (sa[ia].sum(1) / ra[ia].sum(1)) / (sb[ib].sum(1) / rb[ib].sum(1))
        out.update(cost=float((sa.sum() / ra.sum()) / (sb.sum() / rb.sum())),
                   cost_low=float(np.percentile(cost, 2.5)), cost_high=float(np.percentile(cost, 97.5)))
    return out


def rows_for(cells: dict[str, dict[int, list[dict[str, Any]]]], ref: str, configs: list[str] | None,
             target_max: float | None) -> list[dict[str, Any]]:
    if ref not in cells:
        raise SystemExit(f"reference configuration {ref!r} has no timed cells in the raw results "
                         f"(found: {', '.join(sorted(cells)) or 'none'})")
    rows = []
    for name in configs or sorted(cells):
        if name not in cells:
            rows.append({"config": name, "missing": "no timed cells in the raw results (did not start or finish)"})
            continue
        for batch, runs in sorted(cells[name].items()):
            ref_runs = cells[ref].get(batch)
            tokens, seconds, rounds = _arrays(runs)
            row: dict[str, Any] = {"config": name, "batch": batch, "reps": len(runs),
                                   "tok_s": round(pooled_tok_s(runs), 2),
                                   "round_ms": round(1000 * seconds.sum() / rounds.sum(), 3) if rounds.all() else None}
            if ref_runs and name != ref:
                iv = ratio_interval(runs, ref_runs)
                row.update(ref=ref, ref_reps=len(ref_runs), ref_tok_s=round(pooled_tok_s(ref_runs), 2),
                           ratio_vs_ref=round(iv["ratio"], 4), ratio_ci_low=round(iv["ci_low"], 4),
                           ratio_ci_high=round(iv["ci_high"], 4))
                if "cost" in iv:
                    row.update(round_cost_vs_ref=round(iv["cost"], 4), round_cost_ci_low=round(iv["cost_low"], 4),
                               round_cost_ci_high=round(iv["cost_high"], 4))
                    if target_max is not None:
                        row["met"] = bool(iv["cost_high"] <= target_max)
            rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], ref: str, target_max: float | None) -> str:
    lines = [f"Reference: `{ref}`. tok/s pooled over reps (total tokens / total seconds); 95 % intervals by bootstrap "
             f"over reps ({RESAMPLES:,} resamples, seed 0)."
             + (f" Round-cost target: upper end of the interval <= {target_max}." if target_max is not None else ""),
             "", "| config | batch | reps | tok/s | ref tok/s | tok/s vs ref [95 % CI] | s per round (ms) | "
             "round cost vs ref [95 % CI] |" + (" met |" if target_max is not None else ""),
             "|---|---:|---:|---:|---:|---|---:|---|" + ("---|" if target_max is not None else "")]
    for r in rows:
        if "missing" in r:
            lines.append(f"| {r['config']} | | | {r['missing']} | | | | |" + (" |" if target_max is not None else ""))
            continue
        ratio = (f"{r['ratio_vs_ref']:.3f} [{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}]"
                 if "ratio_vs_ref" in r else "(reference)" if r["config"] == ref else "-")
        cost = (f"{r['round_cost_vs_ref']:.3f} [{r['round_cost_ci_low']:.3f}, {r['round_cost_ci_high']:.3f}]"
                if "round_cost_vs_ref" in r else "-")
        met = (" " + ("yes" if r.get("met") else "no" if "met" in r else "-") + " |") if target_max is not None else ""
        lines.append(f"| {r['config']} | {r['batch']} | {r['reps']} | {r['tok_s']} | {r.get('ref_tok_s', '')} | "
                     f"{ratio} | {r['round_ms']} | {cost} |{met}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.e2e.intervals", description=__doc__.split("\n\n")[0])
    ap.add_argument("stem", type=Path, help="writes STEM.json and STEM.md")
    ap.add_argument("raws", type=Path, nargs="+", help="TAG-raw.tgz files or result folders")
    ap.add_argument("--ref", required=True, help="the reference configuration (the stock chain)")
    ap.add_argument("--configs", help="comma-separated configurations, in this order (default: all found)")
    ap.add_argument("--target-max", type=float, help="round-cost target: met when the 95 %% interval's upper end <= it")
    a = ap.parse_args(argv)
    for raw in a.raws:
        if not raw.exists():
            ap.error(f"{raw}: no such file or folder")
    cells = load_cells(a.raws)
    configs = [c for c in a.configs.split(",") if c] if a.configs else None
    rows = rows_for(cells, a.ref, configs, a.target_max)
    doc = {"ref": a.ref, "resamples": RESAMPLES, "seed": 0, "target_max": a.target_max,
           "raws": [str(r) for r in a.raws], "rows": rows}
    a.stem.parent.mkdir(parents=True, exist_ok=True)
    Path(str(a.stem) + ".json").write_text(json.dumps(doc, indent=1) + "\n")
    text = render(rows, a.ref, a.target_max)
    Path(str(a.stem) + ".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
