"""The `speed-by-batch` report: DDTree's speed against the chain at every batch size, does it pay (issue #20),
bench/results/speed-by-batch-h200.{json,md}

  RAW: TAG-raw.tgz files (or directories) of `gpu_run.sh` runs made in ONE lease, holding the `prof-*` configurations
  (the controlled acceptance profile of models/mk_profile.py) and optionally `q8b-*` ones (random weights: the cost
  side). NOTES.md: the hand-written verdict and run commands, put under the title as they are.

Rows {config, batch, round_ms, tokens_per_round, tok_s} per configuration and batch:
- tok_s: output tokens over the wall time of the long generate call (median over reps);
- tokens_per_round: committed tokens per verify round per request (mean over the batch's requests; plain = 1);
- round_ms: that call's wall time over its rounds (the slowest request's verify count; plain: decode steps).
Configuration names map to plain / chain / ddtree-bN / ddtree-schedule by their algorithm and budget. The `-launch`
configurations' launches and host µs per decode round (the round_stats each result JSON carries) become one table per
kind of run (controlled / random weights).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.e2e.e2e_files import load_results, open_raw, result_paths
from bench.e2e.reports import stem_and_raws


TITLE = ("# DDTree at every batch size (H200, SGLang 0.5.17, Qwen3-8B shape + b16 DFlash drafter shape, "
             "CUDA graphs)")


def config_label(cfg: dict) -> str:
    algo = cfg["algo"]
    if algo == "ar":
        return "plain"
    if algo == "chain":
        return "chain"
    budget = cfg.get("budget")
    if budget is None or not str(budget).isdigit():  # -sched: the schedule's text (or auto)
        return "ddtree-schedule" + ("-adapt" if cfg.get("adapt") else "")
    return f"ddtree-b{budget}"


def speed_rows(res: dict) -> list[dict]:
    out = []
    for wl, runs in sorted(res.get("workloads", {}).items()):
        if not wl.startswith("speed-bs"):
            continue
        bs = int(wl[len("speed-bs"):])
        tok_s, round_ms, tpr = [], [], []
        for r in runs:
            meta = r["meta"]
            tok_s.append(r["tokens"] / r["seconds"])
            round_ms.append(1000 * r["seconds"] / max(1, r["rounds"]))
            per_req = [m["completion_tokens"] / m["spec_verify_ct"] if m.get("spec_verify_ct") else 1.0 for m in meta]
            tpr.append(statistics.fmean(per_req))
        out.append({"batch": bs, "tok_s": round(statistics.median(tok_s), 1),
                    "round_ms": round(statistics.median(round_ms), 3),
                    "tokens_per_round": round(statistics.fmean(tpr), 3), "reps": len(runs)})
    return out


def main(argv: list[str]) -> int:
    """Does DDTree pay at every batch size (issue #20): the rows of the controlled-profile and random-weight runs,
    their ratios to the chain, and the launches / host µs per round of the ``-launch`` configurations."""
    ap = stem_and_raws("speed-by-batch", "speed-by-batch tables from gpu_run.sh raw results of one lease",
                       "TAG-raw.tgz files (or result folders)")
    ap.add_argument("--notes", type=Path, help="hand-written Markdown (the verdict, the run commands) put under the "
                    "title as it is")
    ap.add_argument("--related", nargs=2, action="append", default=[], metavar=("KEY", "FILE"),
                    help="another result this one is read with: the JSON gets KEY: {file: FILE}")
    a = ap.parse_args(argv)
    table: dict[str, dict] = {}
    round_stats: dict[str, dict] = {}
    profile = None
    for raw in a.raws:
        d = open_raw(raw)
        pj = d / "models" / "prof-target" / "profile.json"
        if pj.exists():
            profile = json.loads(pj.read_text())
        for name, res in load_results(d).items():
            if not res.get("ok"):
                table[name] = {"error": res.get("error", "failed")}
                continue
            table[name] = {"config": res["config"], "rows": speed_rows(res)}
            if res.get("round_stats", {}).get("batches"):
                round_stats[name] = res["round_stats"]
    out: dict = {"profile": profile, "controlled": [], "random_weights": [], "ratios": {}, "failed": {}}
    for name, t in sorted(table.items()):
        if "error" in t:
            out["failed"][name] = t["error"]
            continue
        kind = "controlled" if t["config"]["modelset"] == "prof" else "random_weights"
        for r in t["rows"]:
            out[kind].append({"config": config_label(t["config"]), "name": name, **r})
    by = {(r["config"], r["batch"]): r for r in out["controlled"]}
    for (cfg, bs), r in sorted(by.items()):
        chain = by.get(("chain", bs))
        if chain and cfg != "chain":
            out["ratios"].setdefault(cfg, {})[bs] = round(r["tok_s"] / chain["tok_s"], 3)
    lines = [TITLE, ""]
    if a.notes:
        lines += [a.notes.read_text().rstrip("\n"), ""]
    lines += [f"Reproduce: `python -m bench.e2e.report speed-by-batch {' '.join(argv)}`", ""]
    if profile:
        p = ", ".join(f"{x:.4f}" for x in profile["probs"])
        ea = profile["expected_accepted"]
        lines += [f"Profile (`prof` models, bench/e2e/models/mk_profile.py): target and drafter share a context-free "
                  f"law over four tokens, P = ({p}) by drafter rank, sampled at temperature {profile['temperature']}: "
                  f"the rank-r candidate holds the target's token with probability P[r] at every depth. Expected "
                  f"tokens per round: chain {1 + ea['chain']:.2f}, "
                  + ", ".join(f"{k} {1 + v:.2f}" for k, v in ea.items() if k != "chain") + ".", ""]
    schedules = sorted({str(t["config"].get("budget")) for t in table.values()
                        if "config" in t and config_label(t["config"]).startswith("ddtree-schedule")})
    if schedules:
        out["schedules"] = schedules
        lines += [f"ddtree-schedule = `--speculative-ddtree-budget {' / '.join(schedules)}`.", ""]
    for kind, title in (("controlled", "Controlled profile"), ("random_weights", "Random weights (cost side only)")):
        if not out[kind]:
            continue
        lines += [f"## {title}", "", "| config | batch | tok/s | tokens/round | round ms | vs chain |",
                  "|---|---|---|---|---|---|"]
        for r in sorted(out[kind], key=lambda r: (r["batch"], r["config"])):
            ratio = out["ratios"].get(r["config"], {}).get(r["batch"]) if kind == "controlled" else None
            lines.append(f"| {r['config']} | {r['batch']} | {r['tok_s']} | {r['tokens_per_round']} | {r['round_ms']} | "
                         f"{'' if ratio is None else ratio} |")
        lines.append("")
    from bench.e2e.round_stats import table as round_stats_table

    for kind, title in (("controlled", "Controlled profile"), ("random_weights", "Random weights")):
        stats = {n: round_stats[n] for n in sorted(round_stats) if (table[n]["config"]["modelset"] == "prof")
                 == (kind == "controlled")}
        if not stats:
            continue
        out[f"round_stats_{kind}"] = stats
        unprofiled = sorted({bs for st in stats.values() for bs, r in st["batches"].items()
                             if r.get("kernel_launches") is None}, key=int)
        lines += ["## Launches and host µs per decode round (worker's forward_batch_generation; counts: median of the "
                  "profiled rounds)", ""] + round_stats_table(stats) + [
                  "", f"{title} (the `-launch` hook" + (f"; batch {', '.join(unprofiled)} rows are the warm-up's"
                                                       if unprofiled else "") + ").", ""]
    for name, path in a.related:
        out[name] = {"file": path}
    if out["failed"]:
        lines += ["## Failed configurations", ""] + [f"- {n}: {e}" for n, e in out["failed"].items()] + [""]
    a.stem.parent.mkdir(parents=True, exist_ok=True)
    out_json, out_md = result_paths(a.stem)
    out_json.write_text(json.dumps(out, indent=1) + "\n")
    out_md.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0
