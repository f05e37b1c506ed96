"""Launches and host microseconds per decode round, from what bench/e2e/round_stats_hook/sitecustomize.py wrote.

Usage: python -m bench.e2e.round_stats DIR [DIR ...]   (one DIR per configuration, e.g. RES/round-stats/NAME;
       prints one table; --json prints the summaries instead)

Per batch size: rounds seen, host µs per round (median and 10th / 90th percentile of the unprofiled rounds after the
warm-up), and the medians over the profiled rounds of CUDA kernel launches, graph launches, memcpy / memset calls
and GPU kernels run (graph kernels included). driver.py calls :func:`summarize` for `-launch` configurations and
puts the result in the configuration's JSON and the report.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

COUNTS = ("kernel_launches", "graph_launches", "copies", "gpu_kernels")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summarize(directory: Path) -> dict:
    """{worker, batches: {bs: {rounds, host_us_median, host_us_p10, host_us_p90, <counts>...}}} over every
    round-stats-PID.json in ``directory`` (several processes: their rounds are pooled)."""
    host: dict[str, list[float]] = {}
    seen: dict[str, int] = {}
    prof: dict[str, list[dict]] = {}
    worker, warmup = None, 0
    for f in sorted(Path(directory).glob("round-stats-*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        worker = worker or d.get("worker")
        warmup = max(warmup, int(d.get("warmup", 0)))
        for bs, xs in d.get("host_us", {}).items():
            host.setdefault(bs, []).extend(xs[int(d.get("warmup", 0)):] or xs)
            seen[bs] = seen.get(bs, 0) + len(xs)
        for bs, rs in d.get("profiled", {}).items():
            prof.setdefault(bs, []).extend(rs)
    batches = {}
    for bs in sorted(set(host) | set(prof), key=int):
        xs = host.get(bs, [])
        row: dict = {"rounds": seen.get(bs, 0) + len(prof.get(bs, [])), "host_rounds": len(xs)}
        if xs:
            row.update(host_us_median=round(statistics.median(xs), 1), host_us_p10=_pct(xs, 0.1),
                       host_us_p90=_pct(xs, 0.9))
        for k in COUNTS:
            vals = [r[k] for r in prof.get(bs, []) if k in r]
            row[k] = statistics.median(vals) if vals else None
        batches[bs] = row
    return {"worker": worker, "warmup": warmup, "batches": batches}


def table(summaries: dict[str, dict]) -> list[str]:
    """Markdown rows: config x batch size."""
    lines = ["| config | batch | rounds | host µs/round (p10-p90) | kernel launches | graph launches | copies | "
             "GPU kernels |", "|---|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        for bs, r in s.get("batches", {}).items():
            span = f"{r['host_us_median']} ({r['host_us_p10']}-{r['host_us_p90']})" if "host_us_median" in r else "-"
            lines.append(f"| {name} | {bs} | {r['rounds']} | {span} | {r['kernel_launches']} | "
                         f"{r['graph_launches']} | {r['copies']} | {r['gpu_kernels']} |")
    return lines


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    dirs = [a for a in argv if a != "--json"]
    if not dirs:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    summaries = {Path(d).name: summarize(Path(d)) for d in dirs}
    print(json.dumps(summaries, indent=1) if as_json else "\n".join(table(summaries)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
