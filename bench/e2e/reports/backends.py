"""The `backends` report: DDTree on the target attention backends triton and FlashInfer at page sizes 1, 16 and 64
(issue #28, "FlashInfer proven on the H200, page size > 1"), bench/results/backends-h200.{md,json}

  LOSSLESS_RAW: TAG-raw.tgz files (or result folders) of gpu_run.sh runs (E2E_BASE=0.5.17, E2E_BUNDLE=.e2e17fi for
  the `-fi` / `-fiv` configurations, `-psN` for page size N); configurations of the same name in a later RAW replace
  earlier ones. The T > 0 fit reads the first raw that carries models/agree-qwen3.
  --speed RAW[,RAW...]: the round-table raws, one per lease (comma-separated); every ratio is taken within one lease.
  --base 0.5.N: the run's E2E_BASE (default 0.5.17), named in the title and passed to driver.report.
  --gpu NAME: the GPU the raws ran on (default H200), named in the title and the JSON.

Sections (the JSON's keys):
- `lossless`: one row per DDTree and chain configuration (and per plain-decoding one that failed): its target
  backend and page size (driver.parse: `-fi` / `-fiv` FlashInfer, `-psN`), greedy output ids against plain decoding
  and (DDTree) against the stock chain of the same backend, page size and graph mode (driver.report's `lossless` and
  `vs_chain`), and whether it ran (`ok`, `error`: a configuration that failed to start or died keeps its row).
- `t_fit`: the T > 0 fit of the sampled tokens to the agree target's exact law (chisq.analyse) when the raws hold
  eager agree configurations with a `sample-T` workload and the agree target's files, else null with `t_fit_reason`.
- `rounds`: round milliseconds (median over reps), tok/s (pooled over reps) and the round's ratio to the chain of the
  same backend and page size in the same lease with its 95 % bootstrap interval (spec_v2.median_ratio_interval),
  per configuration and timed batch of the --speed raws.
- `chain_fi_vs_triton`: each FlashInfer chain's round against the triton chain of the same models, graph mode and page
  size in the same lease (ratio of the median rounds, with its interval).
- `failed`: every configuration of any raw that did not finish, with its error.
- `matrix`: per backend and page size (1, 16, 64 and any other run): `lossless` ("identical", "DIFFERS", "not run" or
  "failed: ...") and `rounds` ("measured", "not run" or "failed: ..."), the summary the README and issue #28 quote.
- `commands`: the command that regenerates the report.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.e2e import chisq, driver, intervals
from bench.e2e.e2e_files import load_results, merge_raws, open_raw, result_paths
from bench.e2e.reports import stem_and_raws
from bench.e2e.reports.spec_v2 import _speed_cell, median_ratio_interval


BACKENDS = ("triton", "flashinfer")
PAGE_SIZES = (1, 16, 64)


def _place(name: str) -> tuple[dict, str, int]:
    """A configuration's parsed name, target attention backend and page size."""
    cfg = driver.parse(name)
    return cfg, cfg.get("attention", "triton"), cfg.get("page_size", 1)


def _compared(by_workload: dict | None) -> dict | None:
    """driver.report's per-workload comparison of one configuration, summed over its workloads."""
    if not by_workload:
        return None
    out = {"identical_requests": sum(v["identical_requests"] for v in by_workload.values()),
           "requests": sum(v["requests"] for v in by_workload.values()), "workloads": list(by_workload)}
    chains = sorted({v["chain"] for v in by_workload.values() if "chain" in v})
    if chains:
        out["chain"] = chains[0] if len(chains) == 1 else chains
    return out


def lossless_rows(summary: dict, rs: dict) -> list[dict]:
    """One row per DDTree and chain configuration of driver.report's summary (and per failed plain-decoding one: the
    baseline its backend's rows miss)."""
    rows = []
    for name, c in sorted(summary["configs"].items()):
        cfg, backend, page = _place(name)
        if cfg["algo"] not in ("chain", "ddtree") and (c.get("ok") or cfg["algo"] != "ar"):
            continue
        plain = driver.baseline(rs, cfg, "ar") if cfg["algo"] != "ar" else None
        vs_plain = _compared(summary["lossless"].get(name))
        if vs_plain and plain:
            vs_plain["plain"] = plain["config"]["name"]
        rows.append({"backend": backend, "page_size": page, "config": name, "algo": cfg["algo"], "graph": cfg["graph"],
                     "draft_attention": cfg.get("draft_attention", "triton"), "vs_plain": vs_plain,
                     "vs_chain": _compared(summary["vs_chain"].get(name)) if cfg["algo"] == "ddtree" else None,
                     "ok": bool(c.get("ok")), "error": c.get("error")})
    return rows


def t_fit_section(rs: dict, raws: list[Path]) -> tuple[dict | None, str | None]:
    """chisq.analyse over the eager agree configurations' sample-T workloads, or None and why not."""
    sampled = {n: d for n, d in rs.items() if n.startswith("agree") and "sample-T" in d.get("workloads", {})}
    if not sampled:
        return None, "no eager agree configuration with a sample-T workload in the lossless raws"
    for raw in raws:
        model = open_raw(raw) / "models" / "agree-qwen3"
        if (model / "config.json").exists():
            return chisq.analyse(sampled, model), None
    return None, "no raw carries models/agree-qwen3 (the agree target the law is computed from)"


def _speed_cells(d: dict) -> dict[int, list[dict]]:
    return {int(wl[len("speed-bs"):]): runs for wl, runs in (d.get("workloads") or {}).items()
            if wl.startswith("speed-bs") and runs}


def _interval(runs: list[float], ref: list[float]) -> tuple[float | None, float | None]:
    if not runs or not ref:
        return None, None
    lo, hi = median_ratio_interval(runs, ref)
    return round(lo, 3), round(hi, 3)


def round_rows(leases: list[dict]) -> tuple[list[dict], list[dict]]:
    """The round table and the FlashInfer-chain-against-triton-chain rows, from each lease's results."""
    rows, side = [], []
    for lease, rs in enumerate(leases, start=1):
        for name, d in sorted(rs.items()):
            cells = _speed_cells(d)
            if not cells:
                continue
            cfg, backend, page = _place(name)
            graph = "-graph" if cfg["graph"] else ""
            ref_name = f"{cfg['modelset']}-chain{graph}{driver.attention_suffix(cfg)}"
            ref_cells = _speed_cells(rs.get(ref_name, {}))
            for batch, runs in sorted(cells.items()):
                cell = _speed_cell(runs)
                ref = _speed_cell(ref_cells[batch]) if batch in ref_cells else None
                row = {"backend": backend, "page_size": page, "config": name, "lease": lease, "batch": batch,
                       "reps": cell["reps"], "round_ms": cell["round_ms"], "tok_s": cell["tok_s"],
                       "tokens_per_round": cell["tokens_per_round"], "chain": ref_name if ref else None,
                       "ratio_vs_chain": None, "ratio_ci_low": None, "ratio_ci_high": None}
                if ref and name != ref_name and cell["round_ms"] and ref["round_ms"]:
                    row["ratio_vs_chain"] = round(cell["round_ms"] / ref["round_ms"], 3)
                    row["ratio_ci_low"], row["ratio_ci_high"] = _interval(cell["round_ms_all"], ref["round_ms_all"])
                rows.append(row)
            if cfg["algo"] != "chain" or backend == "triton":
                continue
            triton = driver.attention_suffix({**cfg, "attention": "triton", "draft_attention": "triton"})
            tri_name = f"{cfg['modelset']}-chain{graph}{triton}"
            tri_cells = _speed_cells(rs.get(tri_name, {}))
            for batch, runs in sorted(cells.items()):
                if batch not in tri_cells:
                    continue
                a, b = _speed_cell(runs), _speed_cell(tri_cells[batch])
                if not (a["round_ms"] and b["round_ms"]):
                    continue
                lo, hi = _interval(a["round_ms_all"], b["round_ms_all"])
                side.append({"backend": backend, "page_size": page, "config": name, "triton": tri_name, "lease": lease,
                             "batch": batch, "round_ms": a["round_ms"], "triton_round_ms": b["round_ms"],
                             "ratio": round(a["round_ms"] / b["round_ms"], 3), "ratio_ci_low": lo, "ratio_ci_high": hi})
    return rows, side


def failed_configs(sources: list[tuple[str, dict]]) -> list[dict]:
    """Every configuration that did not finish, per raw it came from (a record saying why)."""
    out = []
    for src, rs in sources:
        for name, d in sorted(rs.items()):
            if not d.get("ok"):
                _, backend, page = _place(name)
                out.append({"config": name, "backend": backend, "page_size": page, "raw": src,
                            "error": d.get("error") or "no error recorded"})
    return out


def _differs(c: dict | None) -> bool:
    return bool(c) and c["identical_requests"] != c["requests"]


def matrix(lossless: list[dict], rounds: list[dict], failed_speed: list[dict]) -> dict:
    """backend -> page size -> {lossless, rounds}: what the raws say of each cell."""
    pages = sorted({*PAGE_SIZES, *(r["page_size"] for r in lossless + rounds + failed_speed)})
    backends = [*BACKENDS, *sorted({r["backend"] for r in lossless + rounds} - set(BACKENDS))]
    out: dict = {}
    for b in backends:
        for p in pages:
            rows = [r for r in lossless if (r["backend"], r["page_size"]) == (b, p)]
            bad = [f"{r['config']}: {r['error'] or 'no error recorded'}" for r in rows if not r["ok"]]
            ddtree = [r for r in rows if r["ok"] and r["algo"] == "ddtree" and (r["vs_plain"] or r["vs_chain"])]
            if any(_differs(r["vs_plain"]) or _differs(r["vs_chain"]) for r in rows):
                ll = "DIFFERS"
            elif bad:
                ll = "failed: " + "; ".join(bad)
            elif ddtree:
                ll = "identical"
            else:
                ll = "not run"
            timed = [r for r in rounds if (r["backend"], r["page_size"]) == (b, p)]
            dead = [f"{r['config']}: {r['error']}" for r in failed_speed if (r["backend"], r["page_size"]) == (b, p)]
            rd = "measured" if timed else ("failed: " + "; ".join(dead)) if dead else "not run"
            out.setdefault(b, {})[str(p)] = {"lossless": ll, "rounds": rd}
    return out


def command(argv: list[str]) -> str:
    return "python -m bench.e2e.report backends " + " ".join(argv)


def main(argv: list[str]) -> int:
    ap: argparse.ArgumentParser = stem_and_raws(
        "backends", "DDTree on triton and FlashInfer at page sizes 1 / 16 / 64 (#28) from gpu_run.sh raw results",
        "LOSSLESS_RAW: TAG-raw.tgz files (or result folders); later ones win")
    ap.add_argument("--speed", default="", help="round-table raws, one per lease, comma-separated")
    ap.add_argument("--base", default="0.5.17", help="the runs' E2E_BASE (default 0.5.17)")
    ap.add_argument("--gpu", default="H200", help="the GPU the raws ran on, named in the title (default H200)")
    a = ap.parse_args(argv)
    merged = merge_raws(a.raws)
    rs = load_results(merged)
    summary = driver.report(merged, Path(tempfile.mkdtemp()) / "summary", base=a.base)
    lossless = lossless_rows(summary, rs)
    t_fit, t_fit_reason = t_fit_section(rs, a.raws)
    speed_raws = [Path(s) for s in a.speed.split(",") if s]
    leases = [load_results(open_raw(r)) for r in speed_raws]
    rounds, side = round_rows(leases)
    failed_speed = failed_configs([(str(r), rs_) for r, rs_ in zip(speed_raws, leases, strict=True)])
    out = {"base": a.base, "gpu": a.gpu, "matrix": matrix(lossless, rounds, failed_speed), "lossless": lossless, "t_fit": t_fit,
           "t_fit_reason": t_fit_reason, "rounds": rounds, "chain_fi_vs_triton": side,
           "failed": failed_configs([("lossless", rs)]) + failed_speed, "commands": [command(argv)]}
    out_json, out_md = result_paths(a.stem)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(out, indent=1) + "\n")
    out_md.write_text(render(out) + "\n")
    print(out_md.read_text())
    return 0


def _cell(c: dict | None) -> str:
    if not c:
        return "n/a"
    ref = c.get("chain") or c.get("plain")
    return (f"{'DIFFERS' if _differs(c) else 'identical'} ({c['identical_requests']}/{c['requests']} requests, "
            f"{', '.join(c['workloads'])}{f'; against {ref}' if ref else ''})")


def _md(text: str | None) -> str:
    """Free text (an error) as one Markdown table cell."""
    return " ".join((text or "").split()).replace("|", "\\|")


def _ratio(value, lo, hi) -> str:
    if value is None:
        return "-"
    return f"{value} [{lo}, {hi}]" if lo is not None else str(value)


def render(out: dict) -> str:
    lines = [f"# DDTree on the target attention backends triton and FlashInfer, page sizes "
             f"{' / '.join(str(p) for p in PAGE_SIZES)} ({out.get('gpu', 'H200')}, SGLang {out['base']}, issue #28)", "",
             f"Reproduce: `{out['commands'][0]}` (the raw tarballs come from `E2E_BUNDLE=.e2e17fi "
             f"E2E_BASE={out['base']} bash bench/e2e/gpu_run.sh TAG CONFIGS [SEQ]` on the device: bench/e2e/README.md, "
             "\"FlashInfer on the H200 (#28)\").", "",
             "Backend = the target's attention backend (`-fi`: target and DFlash drafter on FlashInfer, `-fiv`: the "
             "target only); page size = `--page-size` (`-psN`, default 1). Every configuration is compared with the "
             "plain decoding and the stock chain of its own backend, page size and graph mode.", "",
             "## matrix", "", "| backend | page size | lossless | rounds |", "|---|---|---|---|"]
    not_run = []
    for b, by_page in out["matrix"].items():
        for p, c in by_page.items():
            lines.append(f"| {b} | {p} | {_md(c['lossless'])} | {_md(c['rounds'])} |")
            parts = [k for k in ("lossless", "rounds") if c[k] == "not run"]
            if parts:
                not_run.append(f"{b} page size {p} ({', '.join(parts)})")
    lines += ["", "Not run: " + ("; ".join(not_run) if not_run else "none") + "."]
    lines += ["", "## lossless", "", "Greedy output ids (batches 1, 4, 16; `stop-bs4`: a stop token inside the accepted "
              "path) against plain decoding and, for DDTree, the stock chain:", "",
              "| config | backend | page size | vs plain | vs stock chain |", "|---|---|---|---|---|"]
    for r in out["lossless"]:
        if not r["ok"]:
            lines.append(f"| {r['config']} | {r['backend']} | {r['page_size']} | failed: {_md(r['error'])} | |")
            continue
        chain = _cell(r["vs_chain"]) if r["algo"] == "ddtree" else "(the chain)"
        lines.append(f"| {r['config']} | {r['backend']} | {r['page_size']} | {_cell(r['vs_plain'])} | {chain} |")
    lines += ["", "## T > 0", ""]
    t = out["t_fit"]
    if t is None:
        lines.append(f"Not measured: {out['t_fit_reason']}.")
    else:
        lines += [f"T = {t['temperature']} (agree models): Pearson fit of the sampled tokens to the target's "
                  "closed-form law (AR is the control) and a two-sample test of the successor rate against AR:", "",
                  "| config | tokens | successor rate (law) | fit p | vs AR p | accepted/round |",
                  "|---|---|---|---|---|---|"]
        for n, r in t["tests"].items():
            lines.append(f"| {n} | {r['tokens']} | {r['successor_rate']} ({r['successor_rate_expected']}) | "
                         f"{r['gof_p']} | {(r.get('vs_ar_two_sample') or dict(p='-'))['p']} | "
                         f"{r['accepted_per_round']} |")
    lines += ["", "## rounds", ""]
    if not out["rounds"]:
        lines.append("Not measured: no --speed raws, or no timed configurations in them.")
    else:
        lines += ["Round ms = (T(long call) - T(short call)) / (their difference in rounds), the median over reps; "
                  "round / chain is the ratio of the medians against the chain of the same backend and page size "
                  "timed in the same lease, with its 95 % interval (bootstrap over each cell's reps, "
                  f"{intervals.RESAMPLES:,} resamples, seed 0); tok/s is pooled over reps (total tokens / total "
                  "seconds).", "",
                  "| config | backend | page size | lease | batch | reps | round ms | round / chain [95 % CI] | tok/s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in out["rounds"]:
            ratio = "(reference)" if r["config"] == r["chain"] else _ratio(
                r["ratio_vs_chain"], r["ratio_ci_low"], r["ratio_ci_high"])
            lines.append(f"| {r['config']} | {r['backend']} | {r['page_size']} | {r['lease']} | {r['batch']} | "
                         f"{r['reps']} | {r['round_ms']} | {ratio} | {r['tok_s']} |")
    if out["chain_fi_vs_triton"]:
        lines += ["", "The stock chain on FlashInfer against the stock chain on triton (same models, graph mode, page "
                  "size and lease; ratio of the median rounds, 95 % interval as above):", "",
                  "| config | triton chain | page size | lease | batch | round ms | triton round ms | ratio [95 % CI] |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in out["chain_fi_vs_triton"]:
            lines.append(f"| {r['config']} | {r['triton']} | {r['page_size']} | {r['lease']} | {r['batch']} | "
                         f"{r['round_ms']} | {r['triton_round_ms']} | "
                         f"{_ratio(r['ratio'], r['ratio_ci_low'], r['ratio_ci_high'])} |")
    if out["failed"]:
        lines += ["", "## configurations that did not finish", "", "| config | raw | error |", "|---|---|---|"]
        lines += [f"| {r['config']} | {r['raw']} | {_md(r['error'])} |" for r in out["failed"]]
    return "\n".join(lines)
