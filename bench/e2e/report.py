"""The reports of the e2e runs: raw results from the device (gpu_run.sh) in, bench/results/*.{json,md} out.

Usage (repository root):
  python -m bench.e2e.report sweep FILES_DIR [--tag TAG] [--results bench/results] [--models /tmp/models]
                                   [--name call4] [--no-gaps]
  python -m bench.e2e.report hybrid OUT_JSON RAW.tgz [RAW.tgz ...]
  python -m bench.e2e.report spec-v2 CORRECTNESS_RAW SPEED_RAW EXPECTED_JSON OUT_STEM [APPLY_TRANSCRIPT_JSON]
  python -m bench.e2e.report pay OUT_STEM RAW [RAW ...] [--notes NOTES.md] [--related KEY FILE]
  python -m bench.e2e.report hybrid17 OUT_STEM RAW [RAW ...] [--kernels KERNELS_JSON]

## sweep: one gpu_run.sh call on SGLang 0.5.11 (bench/results/e2e-call4.{json,md} + chi-square and round share)

  FILES_DIR: what gpu_run.sh left under $OUT (TAG-raw.tgz, orchestrate-TAG.log, and for `-prof` configurations
  TAG-round-share.json). Writes RESULTS/e2e-NAME.json, e2e-NAME.md, e2e-NAME-chisq.json,
  e2e-NAME-round-share.json and copies the raw tarball to e2e-raw-NAME.tgz.

What it answers (issue #8's open points):
1. `big` lossless: every big-* configuration's greedy outputs against big-ar, with big-chain as the control. For a
   divergence it rebuilds the big target (mk_big.py is bit-reproducible; the device's sha256 is checked) and reports
   the float32 logit gap at the first divergent token, as tie_gaps does for the tiny pair (--no-gaps skips it).
2. T > 0: chisq.analyse on the agree configurations' `sample-T` tokens, with the served weights from the tarball.
3. Speed: tok/s (median of 3) per configuration and batch, and the ratio to AR and to the DFlash chain.
4. Round share: bench/e2e/round_share.py's result (run on the device), condensed.
Plus lossless/acceptance for every other configuration (driver.report) and the call's timing from the log.

## hybrid: the hybrid (issue #9) H200 runs, DDTree on GatedDeltaNet targets against every baseline

Each RAW.tgz is a `gpu_run.sh` result tarball (per-configuration JSON + logs). Configurations of the same name in
several tarballs are kept apart (`<tarball tag>:<name>`), which also checks that greedy output is the same across
machine leases. Writes OUT_JSON and OUT_JSON with .md: for every speculative configuration (chain, DDTree) its
greedy outputs against the model set's baselines:
  ar   plain decoding as SGLang ships it (GDN decode = packed kernel, beta rounded to bf16)
  arv  plain decoding with the verify kernel's GDN math (bench/e2e/gdn_unpacked_decode)
  chain  the stock DFlash chain
plus acceptance per round and the start-up errors found in the logs (the budget-memory check).

## spec-v2: the SGLang 0.5.17 (spec-v2) proof, bench/results/sglang-0.5.17-h200.{md,json}

  CORRECTNESS_RAW / SPEED_RAW: the TAG-raw.tgz of gpu_run.sh runs (E2E_BASE=0.5.17); configurations of the same name
  in SPEED_RAW replace those of CORRECTNESS_RAW (re-runs of configurations that failed to start there). SPEED_RAW may
  name several tarballs, comma-separated, one per lease: speed-8b has a row per lease a configuration finished in,
  each against the stock chain timed in that same lease.
  EXPECTED_JSON: expected_acceptance's runtime-only replay (gpu_run.sh writes it beside the results).

Sections: `lossless` (every DDTree configuration against plain decoding and against the stock V2 chain of the same
models and graph mode, greedy batches 1/4/16 and a stop token inside the accepted path; the T > 0 fit to the target's
exact law; acceptance against the replay; the host-sync check), `speed-8b` (round milliseconds and tok/s at the
Qwen3-8B shape, one lease), `apply-transcript` (the product's own apply / rollback run on the GPU machine).

## pay: does DDTree pay at every batch size (issue #20), bench/results/pay-every-batch-h200.{json,md}

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

## hybrid17: issue #15's proof on SGLang 0.5.17, bench/results/hybrid-0.5.17-h200*.{md,json}

  RAW: TAG-raw.tgz (or result folders) of `bench/e2e/hybrid17.sh` parts, with TAG-prof.tgz beside it when the part
  profiled; configurations of the same name in a later RAW replace earlier ones. KERNELS_JSON:
  tests/gpu/test_hybrid_v2_kernels_gpu.py's output (hybrid17.sh writes it as $OUT/hybrid_v2_kernels.json); default:
  hybrid_v2_kernels.json beside the first RAW.

Sections:
- `kernels`: the wired tree verify + commit at Qwen3.6-27B's GatedDeltaNet shapes against float64 per-path
  recurrences, one row per case.
- `lossless`: every hyblive DDTree and chain configuration against plain decoding (`ar`), plain decoding with the
  verify kernel's math (`arv`), plain decoding with DDTree's tree-kernel math (`ard`, DDTree rows only) and the stock
  V2 chain of the same graph mode; greedy batches 1/4/16.
- `round_27b`: round milliseconds (un-profiled speed runs), tokens per round and tok/s of the chain and DDTree at the
  Qwen3.6-27B shape per batch, the GatedDeltaNet verify's share of the round's GPU kernel time (profiled rounds,
  gdn_share), and the start-up memory check's largest budget for each server's max running requests; rows of the
  `prof36` model set (the same shapes with mk_profile's controlled acceptance) in their own table, with tok/s
  against the chain of that set.
- configurations that did not finish (an engine that died at start-up included), each with its error.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.e2e import chisq, driver, gdn_share, intervals
from bench.e2e.e2e_files import load_results, open_raw, result_paths
from bench.e2e.workloads import prompts

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------------------- sweep
SPEED_ORDER = ("ar", "chain", "ddtree-b1", "ddtree-b4", "ddtree-b15", "ddtree-b32", "ddtree-b64")


def _algo_key(cfg: dict) -> str:
    return cfg["algo"] + (f"-b{cfg['budget']}" if cfg["budget"] else "")


def timing(log: Path) -> dict:
    """Setup / phase ends / total and each configuration's wall time, from orchestrate-TAG.log."""
    if not log.exists():
        return {}
    txt = log.read_text()
    out: dict = {"configs": {}}
    for key, pat in (("setup_s", r"^setup (\d+)s"), ("parallel_done_s", r"^parallel phase done at (\d+)s"),
                     ("sequential_done_s", r"^sequential phase done at (\d+)s"), ("total_s", r"^total (\d+)s")):
        m = re.search(pat, txt, re.M)
        if m:
            out[key] = int(m.group(1))
    for m in re.finditer(r"\[\s*([\d.]+)s\] done (\S+) rc=(-?\d+) \(([\d.]+)s\)", txt):
        out["configs"][m.group(2)] = {"ended_at_s": float(m.group(1)), "rc": int(m.group(3)),
                                      "wall_s": float(m.group(4))}
    out["killed"] = re.findall(r"killed (\S+) \(deadline\)", txt)
    m = re.search(r"deadline: not started: (.*)", txt)
    out["not_started"] = m.group(1) if m else None
    return out


def big_lossless(rs: dict) -> dict:
    """Per big configuration and greedy batch: identical to big-ar? which requests differ, and where."""
    base = rs.get("big-ar")
    if not base or not base.get("ok"):
        return {"error": "big-ar missing or failed"} if any(n.startswith("big-") for n in rs) else {}
    out: dict = {}
    for name in sorted(n for n in rs if n.startswith("big-") and n != "big-ar"):
        d = rs[name]
        if not d.get("workloads"):
            out[name] = {"error": d.get("error", "no workloads")}
            continue
        for wl in (w for w in d["workloads"] if w.startswith("greedy")):
            a, b = d["workloads"][wl]["output_ids"], base["workloads"][wl]["output_ids"]
            div = {}
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                k = next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
                if k is None and len(x) != len(y):
                    k = min(len(x), len(y))
                if k is not None:
                    div[i] = {"position": k, "ar_token": y[k] if k < len(y) else None,
                              "spec_token": x[k] if k < len(x) else None}
            out.setdefault(name, {})[wl] = {"identical": not div, "requests": len(a), "diverged": div}
    return out


def tie_gaps(rs: dict, lossless: dict, raw: Path, models: Path) -> dict:
    """Float32 logits of the rebuilt big target at every first divergence (given the AR prefix)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from bench.e2e.models import mk_big

    cases = [(n, wl, int(i), v) for n, wls in lossless.items() if isinstance(wls, dict)
             for wl, r in wls.items() if isinstance(r, dict) and "diverged" in r for i, v in r["diverged"].items()]
    if not cases:
        return {"cases": []}
    if not (models / "tiny-qwen3").exists():
        mk = HERE.parent.parent / ".e2e" / "mk_models.py"
        if not mk.exists():
            mk = HERE.parent.parent.parent / "shared" / "gpu-e2e" / "mk_models.py"
        subprocess.run([sys.executable, str(mk), str(models)], check=True, capture_output=True)
    stamp = json.loads((raw / "models" / "big-qwen3" / "mk_big.json").read_text())
    p = stamp["params"]
    rec = mk_big.build(Path(tempfile.mkdtemp()), models, beta=p["beta"], lm_std=p["lm_std"], seed=p["seed"])
    out: dict = {"sha256_device": stamp["sha256"], "sha256_local": rec["sha256"],
                 "same_weights": stamp["sha256"] == rec["sha256"], "cases": []}
    m = Qwen3ForCausalLM.from_pretrained(rec["target"], dtype=torch.float32).eval()
    allp = prompts(16)
    base = rs["big-ar"]["workloads"]
    for name, wl, i, v in cases:
        ar_ids = base[wl]["output_ids"][i]
        k = v["position"]
        if v["ar_token"] is None or v["spec_token"] is None:
            continue
        with torch.no_grad():
            lg = m(torch.tensor([allp[i] + ar_ids[:k]])).logits[0, -1]
        top = lg.topk(3)
        gap = float(lg[v["ar_token"]] - lg[v["spec_token"]])
        out["cases"].append({"config": name, "workload": wl, "request": i, "position": k,
                             "ar_token": v["ar_token"], "spec_token": v["spec_token"],
                             "fp32_top3": top.indices.tolist(), "fp32_top3_logits": [round(x, 5) for x in top.values.tolist()],
                             "gap_ar_minus_spec": gap, "rel_gap": gap / abs(float(top.values[0])),
                             "fp32_argmax_is": "ar" if int(top.indices[0]) == v["ar_token"] else
                             "spec" if int(top.indices[0]) == v["spec_token"] else "neither"})
    return out


def speed_table(summary: dict) -> dict:
    """modelset -> algo -> batch -> {tok_per_s, tokens_per_round, vs_ar, vs_chain} from the report's speed section."""
    table: dict = {}
    for name, wls in summary.get("speed", {}).items():
        cfg = driver.parse(name)
        for wl, v in wls.items():
            bs = int(wl[len("speed-bs"):])
            table.setdefault(cfg["modelset"], {}).setdefault(_algo_key(cfg), {})[bs] = {
                "config": name, "tok_per_s": v["tok_per_s_median"], "all": v["tok_per_s_all"],
                "tokens_per_round": v["tokens_per_round"]}
    for algos in table.values():
        for algo, bss in algos.items():
            for bs, v in bss.items():
                for ref in ("ar", "chain"):
                    r = algos.get(ref, {}).get(bs)
                    if r and algo != ref:
                        v[f"vs_{ref}"] = round(v["tok_per_s"] / r["tok_per_s"], 3)
    return table


def condense_round_share(rsj: dict) -> dict:
    out = {}
    for key, a in rsj.get("traces", {}).items():
        if not a.get("rounds"):
            out[key] = {"error": a.get("error")}
            continue
        out[key] = {"method": a["method"], "rounds": a["rounds"],
                    "wall_us_per_round_unprofiled": a.get("wall_us_per_round_unprofiled"),
                    "wall_us_per_round_profiled": (a.get("wall_us_per_round_profiled") or {}).get("median"),
                    "gpu_busy_us_per_round": a["gpu_us_per_round"]["busy_union_median"],
                    "gpu_kernel_sum_us_per_round": a["gpu_us_per_round"]["kernel_sum_median"],
                    "ddtree_core": a["ddtree_core"], "ddtree_all": a["ddtree_all"],
                    "per_step_gpu_us": {c: v["gpu_us_per_round"] for c, v in a["categories"].items()},
                    "per_step_host_share": {c: v["share_of_round_host"] for c, v in a["categories"].items()}}
    return out


def markdown(res: dict) -> str:
    L = [f"# DDTree e2e on the H200 — {res['tag']}", ""]
    t = res.get("timing", {})
    if t:
        L += [f"Call: setup {t.get('setup_s')} s, parallel phase done at {t.get('parallel_done_s')} s, sequential "
              f"phase done at {t.get('sequential_done_s')} s, total {t.get('total_s')} s; killed at a deadline: "
              f"{t.get('killed') or 'none'}; not started: {t.get('not_started') or 'none'}.", ""]
    L += ["## Configurations", "", "| config | ok | start-up s | total s | error |", "|---|---|---|---|---|"]
    for n, c in res["configs"].items():
        L.append(f"| {n} | {c.get('ok')}{' (checkpoint)' if c.get('checkpoint') else ''} | {c.get('startup_s')} | "
                 f"{c.get('total_s')} | {(c.get('error') or '')[:100]} |")
    bl = res.get("big_lossless") or {}
    if bl:
        L += ["", "## `big` (random, hidden 1024, 8 layers): greedy DDTree vs AR", "",
              "| config | batch 1 | batch 4 | batch 16 | diverged requests (position) |", "|---|---|---|---|---|"]
        for n, wls in bl.items():
            if "error" in wls:
                L.append(f"| {n} | {wls['error']} | | | |")
                continue
            cells = [("identical" if wls.get(f"greedy-bs{b}", {}).get("identical") else
                      f"{len(wls.get(f'greedy-bs{b}', {}).get('diverged', {}))} differ") for b in (1, 4, 16)]
            divs = {wl: {i: v["position"] for i, v in r["diverged"].items()} for wl, r in wls.items() if r["diverged"]}
            L.append(f"| {n} | {' | '.join(cells)} | {divs or ''} |")
        g = res.get("big_tie_gaps") or {}
        if g.get("cases"):
            L += ["", f"Float32 logit gap at each first divergence (rebuilt weights identical to the device's: "
                  f"{g.get('same_weights')}):", "", "| config | workload | request | position | AR tok | spec tok | "
                  "gap AR-spec | relative to top logit | fp32 argmax |", "|---|---|---|---|---|---|---|---|---|"]
            for c in g["cases"]:
                L.append(f"| {c['config']} | {c['workload']} | {c['request']} | {c['position']} | {c['ar_token']} | "
                         f"{c['spec_token']} | {c['gap_ar_minus_spec']:.2e} | {c['rel_gap']:.2e} | "
                         f"{c['fp32_argmax_is']} |")
    L += ["", "## Lossless, all configurations (driver report: greedy / stop vs the same model set's AR)", "",
          "| config | workload | identical | requests identical | first divergence |", "|---|---|---|---|---|"]
    for n, wls in sorted(res["report"]["lossless"].items()):
        for wl, v in wls.items():
            L.append(f"| {n} | {wl} | {v['identical']} | {v['identical_requests']}/{v['requests']} | "
                     f"{[x for x in v['first_divergence'] if x is not None][:6]} |")
    L += ["", "## Acceptance (accepted drafts per verify round)", "",
          "| config | workload | rounds | accepted/round | tokens/round |", "|---|---|---|---|---|"]
    for n, wls in sorted(res["report"]["acceptance"].items()):
        for wl, v in wls.items():
            L.append(f"| {n} | {wl} | {v['verify_rounds']} | {v['accepted_per_round']} | {v['tokens_per_round']} |")
    cs = res.get("chisq") or {}
    if cs.get("tests"):
        L += ["", f"## T = {cs['temperature']}: goodness of fit to the agree target's exact law (dof 5)", "",
              "| config | tokens | successor rate (law) | GOF chi2 | p | two-sample vs AR p | accepted/round |",
              "|---|---|---|---|---|---|---|"]
        for n, r in cs["tests"].items():
            L.append(f"| {n} | {r['tokens']} | {r['successor_rate']} ({r['successor_rate_expected']}) | "
                     f"{r['gof_chi2']} | {r['gof_p']} | {r.get('vs_ar_two_sample', {}).get('p', '–')} | "
                     f"{r['accepted_per_round']} |")
    sp = res.get("speed") or {}
    for ms, algos in sp.items():
        bss = sorted({b for a in algos.values() for b in a})
        L += ["", f"## Speed, `{ms}` (CUDA graphs, one engine at a time, median tok/s of 3 calls; ratio to AR and to the chain)", "",
              "| config | " + " | ".join(f"batch {b}" for b in bss) + " | tokens/round |",
              "|---|" + "---|" * len(bss) + "---|"]
        for algo in sorted(algos, key=lambda a: SPEED_ORDER.index(a) if a in SPEED_ORDER else 99):
            cells = []
            for b in bss:
                v = algos[algo].get(b)
                if not v:
                    cells.append("–")
                    continue
                ratios = [f"{v[k]}x {k[3:].upper() if k == 'vs_ar' else k[3:]}" for k in ("vs_ar", "vs_chain") if k in v]
                cells.append(f"{v['tok_per_s']:,.0f}" + (f" ({', '.join(ratios)})" if ratios else ""))
            tpr = {b: algos[algo][b]["tokens_per_round"] for b in bss if b in algos[algo]}
            L.append(f"| {algo} | " + " | ".join(cells) + f" | {tpr} |")
    rsh = res.get("round_share") or {}
    if rsh:
        L += ["", "## Per-round share of the DDTree steps (SGLang's torch profiler, in situ)", "",
              "GPU us per round of the DDTree core steps (draft top-k, tree, verify inputs, mask, sampling, walk, "
              "KV compaction) against the round's GPU busy time and its un-profiled wall time (speed runs); host "
              "share = the steps' exclusive Python time over the round's, under the profiler.", "",
              "| trace | rounds | wall us/round (unprofiled) | GPU busy us/round | DDTree core GPU us | of GPU | "
              "of wall | DDTree host share (all steps) |", "|---|---|---|---|---|---|---|---|"]
        for k, a in rsh.items():
            if "error" in a:
                L.append(f"| {k} | {a['error']} | | | | | | |")
                continue
            c = a["ddtree_core"]
            L.append(f"| {k} | {a['rounds']} | {a['wall_us_per_round_unprofiled']} | {a['gpu_busy_us_per_round']} | "
                     f"{c['gpu_us_per_round']} | {c['share_of_round_gpu']} | {c.get('gpu_share_of_unprofiled_wall')} | "
                     f"{a['ddtree_all']['share_of_round_host']} |")
        for k, a in rsh.items():
            if "per_step_gpu_us" in a:
                L += ["", f"{k}: GPU us per round by step: " + ", ".join(
                    f"{c} {v}" for c, v in sorted(a["per_step_gpu_us"].items(), key=lambda kv: -kv[1]))]
    return "\n".join(L) + "\n"


def sweep(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.e2e.report sweep",
                                 description="one gpu_run.sh call on SGLang 0.5.11: e2e-NAME.{json,md} and companions")
    ap.add_argument("files", type=Path)
    ap.add_argument("--tag", default=None, help="TAG given to gpu_run.sh (default: from the *-raw.tgz name)")
    ap.add_argument("--results", type=Path, default=HERE.parent / "results")
    ap.add_argument("--models", type=Path, default=Path("/tmp/models"), help="holds (or gets) mk_models.py's output")
    ap.add_argument("--name", default="call4", help="results are named e2e-NAME*")
    ap.add_argument("--no-gaps", action="store_true")
    a = ap.parse_args(argv)
    raws = sorted(a.files.glob(f"{a.tag}-raw.tgz" if a.tag else "*-raw.tgz"))
    if len(raws) != 1:
        raise SystemExit(f"expected one raw tarball in {a.files}, found {[r.name for r in raws]}")
    tag = a.tag or raws[0].name[: -len("-raw.tgz")]
    raw = open_raw(raws[0])
    rs = load_results(raw)
    summary = driver.report(raw, Path(tempfile.mkdtemp()) / "report")
    res: dict = {"tag": tag, "timing": timing(a.files / f"orchestrate-{tag}.log"), "configs": {}, "report": summary}
    for n, d in sorted(rs.items()):
        res["configs"][n] = {k: d.get(k) for k in ("ok", "error", "startup_s", "total_s", "checkpoint")}
    res["big_lossless"] = big_lossless(rs)
    if res["big_lossless"] and not a.no_gaps and "error" not in res["big_lossless"]:
        res["big_tie_gaps"] = tie_gaps(rs, res["big_lossless"], raw, a.models)
    if any("sample-T" in d.get("workloads", {}) for d in rs.values()):
        res["chisq"] = chisq.analyse(rs, raw / "models" / "agree-qwen3")
        (a.results / f"e2e-{a.name}-chisq.json").write_text(json.dumps(res["chisq"], indent=1))
    res["speed"] = speed_table(summary)
    rsf = a.files / f"{tag}-round-share.json"
    if rsf.exists():
        full = json.loads(rsf.read_text())
        (a.results / f"e2e-{a.name}-round-share.json").write_text(json.dumps(full, indent=1))
        res["round_share"] = condense_round_share(full)
    (a.results / f"e2e-{a.name}.json").write_text(json.dumps(res, indent=1, default=str))
    (a.results / f"e2e-{a.name}.md").write_text(markdown(res))
    shutil.copy(raws[0], a.results / f"e2e-raw-{a.name}.tgz")
    print(f"wrote {a.results}/e2e-{a.name}.json, .md" + (", -chisq.json" if "chisq" in res else "") +
          (", -round-share.json" if "round_share" in res else "") + f", e2e-raw-{a.name}.tgz")
    return 0


# ------------------------------------------------------------------------------------------------------ hybrid
HYBRID_WORKLOADS = ("greedy-bs1", "greedy-bs4", "greedy-bs16")


def hybrid_load(tgz: Path) -> tuple[dict, dict]:
    """(configs by `tag:name`, start-up errors by `tag:name`) from one result tarball."""
    tag = re.sub(r"^e2e-raw-|-raw$", "", tgz.name.removesuffix(".tgz"))  # e2e-raw-hyb1.tgz / hyb-raw.tgz
    raw = open_raw(tgz)
    out = {f"{tag}:{name}": d for name, d in load_results(raw).items()}
    errors = {}
    for log in sorted((raw / "logs").glob("*.log")):
        hit = re.findall(r"ValueError: (DDTree budget .*?largest budget that fits is \d+[^\n]*)",
                         log.read_text(errors="replace"))
        if hit:
            errors[f"{tag}:{log.stem}"] = hit[-1]
    return out, errors


def hybrid(argv: list[str]) -> int:
    """Tables for the hybrid (issue #9) H200 runs: DDTree on GatedDeltaNet targets against every baseline."""
    if len(argv) < 2:
        raise SystemExit("usage: python -m bench.e2e.report hybrid OUT_JSON RAW.tgz [RAW.tgz ...]")
    out_json = Path(argv[0])
    runs, errors = {}, {}
    for t in argv[1:]:
        r, e = hybrid_load(Path(t))
        runs.update(r)
        errors.update(e)
    ok = {k: v for k, v in runs.items() if v.get("ok")}

    def find(modelset: str, algo: str, graph: bool) -> list[str]:
        want = f"{modelset}-{algo}" + ("-graph" if graph else "")
        return sorted(k for k in ok if k.split(":", 1)[1] == want)

    rows, acceptance = [], []
    for key in sorted(ok):
        cfg = ok[key]["config"]
        if cfg["algo"] not in ("chain", "ddtree"):
            continue
        for base_algo in ("ar", "arv", "chain"):
            if base_algo == "chain" and cfg["algo"] == "chain":
                continue
            for graph in (False, True):
                for bkey in find(cfg["modelset"], base_algo, graph):
                    for wl in HYBRID_WORKLOADS:
                        a = ok[key]["workloads"].get(wl, {}).get("output_ids")
                        b = ok[bkey]["workloads"].get(wl, {}).get("output_ids")
                        if a is None or b is None:
                            continue
                        if len(a) != len(b):
                            raise SystemExit(f"{key} vs {bkey} {wl}: {len(a)} vs {len(b)} requests")
                        fd = driver.first_divergences(a, b)
                        rows.append({"config": key, "baseline": bkey, "workload": wl, "requests": len(a),
                                     "identical_requests": sum(k is None for k in fd),
                                     "first_divergence": [k for k in fd if k is not None]})
        for wl in HYBRID_WORKLOADS:
            meta = ok[key]["workloads"].get(wl, {}).get("meta", [])
            rounds = sum((m.get("spec_verify_ct") or 0) for m in meta)
            acc = sum((m.get("spec_accepted_drafts") or 0) for m in meta)
            if rounds:
                acceptance.append({"config": key, "workload": wl, "rounds": rounds,
                                   "accepted_per_round": round(acc / rounds, 4)})
    # The same configuration in two leases: identical greedy output?
    cross = []
    names = {}
    for k in ok:
        names.setdefault(k.split(":", 1)[1], []).append(k)
    for n, ks in sorted(names.items()):
        if len(ks) > 1:
            same = all(ok[ks[0]]["workloads"][wl]["output_ids"] == ok[k]["workloads"][wl]["output_ids"]
                       for k in ks[1:] for wl in HYBRID_WORKLOADS if wl in ok[ks[0]]["workloads"])
            cross.append({"config": n, "runs": ks, "identical": same})
    summary = {"rows": rows, "acceptance": acceptance, "cross_lease": cross, "startup_errors": errors,
               "failed": {k: v.get("error") for k, v in runs.items() if not v.get("ok")}}
    out_json.write_text(json.dumps(summary, indent=1))

    lines = ["# Hybrid (GatedDeltaNet) DDTree on the H200: generated tables", "",
             f"Generated by `python -m bench.e2e.report hybrid` from {', '.join(Path(t).name for t in argv[1:])}.", "",
             "## Greedy output against each baseline", "",
             "| config | baseline | workload | identical requests | first divergences |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['baseline']} | {r['workload']} | {r['identical_requests']}/{r['requests']} "
                     f"| {r['first_divergence'][:8]} |")
    lines += ["", "## Acceptance (accepted drafts per verify round)", "", "| config | workload | rounds | accepted/round |",
              "|---|---|---|---|"]
    lines += [f"| {a['config']} | {a['workload']} | {a['rounds']} | {a['accepted_per_round']} |" for a in acceptance]
    lines += ["", "## Same configuration in two leases", "", "| config | runs | identical greedy output |", "|---|---|---|"]
    lines += [f"| {c['config']} | {', '.join(c['runs'])} | {c['identical']} |" for c in cross]
    lines += ["", "## Start-up errors (budget-memory check)", ""]
    lines += [f"- `{k}`: {v}" for k, v in sorted(errors.items())] or ["- none"]
    out_json.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("wrote", out_json, out_json.with_suffix(".md"))
    return 0


# ----------------------------------------------------------------------------------------------------- spec-v2
V2_SPEED_CONFIGS = ("q8b-ar-graph", "q8b-chain-graph", "q8b-ddtree-b16-graph", "q8b-ddtree-b32-graph",
                 "q8b-ddtree-b64-graph")


def merge_raws(raws: list[Path]) -> Path:
    """One directory with every configuration's result JSON, logs and profiler traces; a configuration of the same
    name in a later RAW replaces the earlier one. A TAG-raw.tgz's TAG-prof.tgz beside it (gpu_run.sh returns the
    traces in their own tarball) is unpacked into prof/ too."""
    out = Path(tempfile.mkdtemp())
    (out / "logs").mkdir()
    (out / "prof").mkdir()
    for raw in raws:
        prof = raw.with_name(raw.name.replace("-raw.tgz", "-prof.tgz"))
        if raw.name.endswith("-raw.tgz") and prof.exists():
            shutil.copytree(open_raw(prof) / "prof", out / "prof", dirs_exist_ok=True)
        src = open_raw(raw)
        for f in src.glob("*.json"):
            shutil.copy(f, out / f.name)
        for sub in ("logs", "prof"):
            if (src / sub).is_dir():
                shutil.copytree(src / sub, out / sub, dirs_exist_ok=True)
    return out


def _speed_cell(runs: list[dict]) -> dict:
    """One timed cell (a configuration at one batch): median round ms, tok/s pooled over reps, tokens per round."""
    rms = sorted(r["round_ms"] for r in runs if r.get("round_ms") is not None)
    verify = sum((m.get("spec_verify_ct") or 0) for r in runs for m in r["meta"])
    accepted = sum((m.get("spec_accepted_drafts") or 0) for r in runs for m in r["meta"])
    return {"reps": len(runs), "round_ms": rms[len(rms) // 2] if rms else None, "round_ms_all": rms,
            "tok_s": round(intervals.pooled_tok_s(runs), 1),
            "tokens_per_round": round((accepted + verify) / verify, 3) if verify else 1.0}


def median_ratio_interval(a: list[float], b: list[float], *, resamples: int = intervals.RESAMPLES,
                          seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of median(a) / median(b), each list's reps resampled with replacement."""
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ra = np.median(xa[rng.integers(0, len(xa), size=(resamples, len(xa)))], axis=1)
    rb = np.median(xb[rng.integers(0, len(xb), size=(resamples, len(xb)))], axis=1)
    q = ra / rb
    return float(np.percentile(q, 2.5)), float(np.percentile(q, 97.5))


def v2_speed_rows(leases: list[dict]) -> list[dict]:
    """speed-8b rows from each lease's results (config -> result JSON): every configuration of V2_SPEED_CONFIGS that
    finished there, its round time against the stock chain of the same lease (median over median, with the 95 %
    bootstrap interval); a configuration timed in several leases has a row per lease."""
    rows = []
    for n, rs in enumerate(leases, start=1):
        chain = {int(wl[len("speed-bs"):]): runs for wl, runs in
                 (rs.get("q8b-chain-graph", {}).get("workloads") or {}).items() if wl.startswith("speed-bs")}
        for name in V2_SPEED_CONFIGS:
            wls = {int(wl[len("speed-bs"):]): runs for wl, runs in (rs.get(name, {}).get("workloads") or {}).items()
                   if wl.startswith("speed-bs") and runs}
            for batch, runs in sorted(wls.items()):
                row = {"config": name, "lease": n, "batch": batch, **_speed_cell(runs)}
                ref = _speed_cell(chain[batch]) if chain.get(batch) else None
                row["round_vs_chain"] = round(row["round_ms"] / ref["round_ms"], 3) if ref and ref["round_ms"] else None
                if ref and name != "q8b-chain-graph" and row["round_ms_all"] and ref["round_ms_all"]:
                    lo, hi = median_ratio_interval(row["round_ms_all"], ref["round_ms_all"])
                    row["round_vs_chain_ci"] = [round(lo, 3), round(hi, 3)]
                rows.append(row)
    return rows


def spec_v2(argv: list[str]) -> int:
    """The SGLang 0.5.17 (spec-v2) proof, from the H200 runs' raw results (``--base 0.5.N`` for another spec-v2 base:
    the run's E2E_BASE, named in the title and the commands)."""
    base = "0.5.17"
    if argv[:1] == ["--base"] and len(argv) > 1:
        base, argv = argv[1], argv[2:]
    if len(argv) not in (4, 5):
        raise SystemExit("usage: python -m bench.e2e.report spec-v2 [--base 0.5.N] CORRECTNESS_RAW SPEED_RAW "
                         "EXPECTED_JSON OUT_STEM [APPLY_TRANSCRIPT_JSON]")
    correct, expected, stem = Path(argv[0]), Path(argv[2]), Path(argv[3])
    leases = [Path(a) for a in argv[1].split(",") if a]  # SPEED_RAW: one tarball per lease, comma-separated
    merged = merge_raws([correct, *leases])  # the speed runs' re-runs win
    rep = Path(tempfile.mkdtemp())
    (rep / "expected-acceptance.json").write_text(expected.read_text())  # report() reads it beside its result
    summary = driver.report(merged, rep / "summary", base=base)  # spec-v2's acceptance accounting
    raw = open_raw(correct)
    rs = load_results(merged)
    t_fit = chisq.analyse(rs, raw / "models" / "agree-qwen3")
    sync = []
    for log in sorted((raw / "logs").glob("*-sync.log")):
        lines = [ln for ln in log.read_text().splitlines() if "DDTree sync check" in ln]
        zero = sum("round" in ln and ": 0 synchronizing" in ln for ln in lines)
        sync.append({"config": log.stem, "rounds": len(lines), "rounds_without_sync": zero,
                     "rounds_with_sync": [ln.split("DDTree sync check, ", 1)[1] for ln in lines
                                          if ": 0 synchronizing" not in ln]})
    speed_rows = v2_speed_rows([load_results(open_raw(lease)) for lease in leases])
    out = {"lossless": {"vs_plain": summary["lossless"], "vs_chain": summary["vs_chain"],
                        "t_fit": t_fit, "replay": summary.get("replay", {}), "sync_check": sync,
                        "configs": summary["configs"], "acceptance": summary["acceptance"]},
           "speed-8b": speed_rows, "base": base}
    if len(argv) == 5:
        out["apply-transcript"] = json.loads(Path(argv[4]).read_text())
    out_json, out_md = result_paths(stem)
    out_json.write_text(json.dumps(out, indent=1) + "\n")
    out_md.write_text(render_v2(out, argv if base == "0.5.17" else ["--base", base, *argv]) + "\n")
    print(out_md.read_text())
    return 0


def _chain_span(rows: list[dict]) -> str:
    """The stock chain's round ms per batch over the leases (``7.89-7.9 / 10.04 / ...``), or '' if it was not timed."""
    by_batch: dict[int, list[float]] = {}
    for r in rows:
        if r["config"] == "q8b-chain-graph" and r["round_ms"] is not None:
            by_batch.setdefault(r["batch"], []).append(r["round_ms"])
    return " / ".join(f"{min(v)}" if min(v) == max(v) else f"{min(v)}-{max(v)}" for _, v in sorted(by_batch.items()))


def render_v2(out: dict, argv: list[str]) -> str:
    ll = out["lossless"]
    ddt = sorted(n for n in ll["configs"] if "-ddtree-" in n and not n.startswith("q8b"))
    base = out.get("base", "0.5.17")
    lines = [f"# DDTree on SGLang {base} (spec-v2 DFlashWorkerV2), H200", "",
             f"Reproduce: `python -m bench.e2e.report spec-v2 {' '.join(argv)}` (the raw tarballs come from "
             f"`E2E_BASE={base} bash bench/e2e/gpu_run.sh TAG CONFIGS [SEQ]` on the device; commands in the README of "
             f"patches/ddtree/sglang-{base}).", "",
             "Models: `agree` (a tiny Qwen3 target with a known greedy cycle and a DFlash drafter, block 8, whose top-4 "
             "always holds the target's token but whose top-1 is right a quarter of the time), `rand` (tiny random "
             "target + drafter, block 4), `q8b` (Qwen3-8B shape + z-lab b16 drafter shape, random weights). "
             "Triton attention, page size 1, overlap scheduler on unless `-noov`; `-graph` = decode CUDA graphs "
             "(draft and target verify), `-pgraph` = also the base's piecewise prefill graphs.", "",
             "## lossless", "",
             "Greedy output ids (batches 1, 4, 16; `stop-bs4`: a stop token inside the accepted path):", "",
             "| config | vs plain decoding | vs the stock V2 chain |", "|---|---|---|"]
    for n in ddt:
        def cell(d: dict) -> str:
            if not d:
                return "n/a"
            ok = sum(v["identical_requests"] for v in d.values())
            tot = sum(v["requests"] for v in d.values())
            return f"{'identical' if ok == tot else 'DIFFERS'} ({ok}/{tot} requests, {', '.join(sorted(d))})"
        lines.append(f"| {n} | {cell(ll['vs_plain'].get(n, {}))} | {cell(ll['vs_chain'].get(n, {}))} |")
    rand_chain = ll["vs_plain"].get("rand-chain", {})
    lines += ["", "Explained differences: on the random `rand` models the stock DFlash chain itself differs from plain "
              "decoding, at exactly the requests and first positions where DDTree does "
              f"({', '.join(k + ': ' + str(v['identical_requests']) + '/' + str(v['requests']) for k, v in rand_chain.items())}); "
              "DDTree is token-identical to the chain there (table above). Speculative verify runs the target's "
              "TARGET_VERIFY (extend) kernels, plain decoding its decode kernels, and random bf16 models have "
              "near-tied logits that the two round differently (the 0.5.11 proof measured the same kind of ties).", "",
              "Acceptance against the runtime-only replay (`expected_acceptance.py`: the same tree build and walk "
              f"in plain torch on the agree models' known distributions; {base} counts every draft the last round "
              "accepted):", "", "| config | measured accepted/round | replay | equal |", "|---|---|---|---|"]
    for n, v in sorted(ll["replay"].items()):
        lines.append(f"| {n} | {v['measured']} | {v['replay']} | {v['equal']} |")
    lines += ["", "T = " + str(ll['t_fit']['temperature']) + " (agree models, " + str(ll['t_fit']['tests'].get('agree-ar', {}).get('tokens')) + " "
              "tokens per configuration): Pearson fit of the sampled tokens to the target's closed-form law (AR is "
              "the control) and a two-sample test of the successor rate against AR:", "",
              "| config | tokens | successor rate (law) | fit p | vs AR p | accepted/round |", "|---|---|---|---|---|---|"]
    for n, r in ll["t_fit"]["tests"].items():
        lines.append(f"| {n} | {r['tokens']} | {r['successor_rate']} ({r['successor_rate_expected']}) | {r['gof_p']} | "
                     f"{(r.get('vs_ar_two_sample') or dict(p='-'))['p']} | {r['accepted_per_round']} |")
    lines += ["", "Host synchronisation inside the DDTree round (`-sync`: torch's sync debug mode around everything the "
              "patch set does after the draft forward, verify forward included):", ""]
    for s in ll["sync_check"]:
        lines.append(f"- {s['config']}: {s['rounds_without_sync']} of {s['rounds']} rounds without any synchronising "
                     f"call; the others: {'; '.join(s['rounds_with_sync']) or 'none'}")
    lines += ["", "The first round's sites are one-time set-up: torch's lazy CUDA initialisation and, on the eager path, "
              "the first copy of the tree builder's candidate table to the device (`ddtree/keys.py`, cached per "
              "budget); with CUDA graphs the table is copied at warm-up, before capture."]
    rows = out["speed-8b"]
    n_leases = len({r.get("lease") for r in rows})
    lines += ["", "## speed-8b", "", "Qwen3-8B shape, random weights (`--load-format dummy`, so the drafter accepts "
              "nothing and tokens/round is 1), CUDA graphs, 512-token prompts, one configuration timed at a time"
              + (f", in {n_leases} leases; each ratio is against the stock chain timed in the same lease" if n_leases > 1
                 else ", one lease") + ". Round ms = (T(64 tokens) - T(16 tokens)) / (their difference in rounds), the "
              "median over reps: a decode step for plain decoding, a draft + verify round for the chain and DDTree; "
              "round / chain is the ratio of the medians, with its 95 % interval (bootstrap over each cell's reps, "
              f"{intervals.RESAMPLES:,} resamples, seed 0); tok/s is pooled over reps (total tokens / total seconds).",
              "", "| config | lease | batch | reps | round ms | round / chain [95 % CI] | tok/s |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = r.get("round_vs_chain_ci")
        ratio = (f"{r['round_vs_chain']} [{ci[0]}, {ci[1]}]" if ci else
                 "(reference)" if r["config"] == "q8b-chain-graph" else str(r["round_vs_chain"]))
        lines.append(f"| {r['config']} | {r.get('lease', 1)} | {r['batch']} | {r.get('reps', '')} | {r['round_ms']} | "
                     f"{ratio} | {r['tok_s']} |")
    lines += ["", "DDTree must commit (round / chain) times the chain's tokens per round to break even; with random "
              "weights it cannot, which is what this table is for: the cost side of the trade-off on the base users "
              "run. The 0.5.11 V1 chain measured 10.67 / 13.80 / 32.23 ms at batch 1 / 8 / 32 on the same shape "
              "(issue text)" + (f"; the V2 chain here is {_chain_span(rows)} ms" if _chain_span(rows) else "") + "."]
    if "apply-transcript" in out:
        t = out["apply-transcript"]
        lines += ["", "## apply-transcript", "",
                  "ddtree-deploy itself, on the GPU machine as a `connection: local` host, deploying onto the real "
                  f"SGLang {base} installed there (server: the real `sglang.launch_server`, agree models, DDTree b15, "
                  f"CUDA graphs), then a broken overlay that must be refused before the switch or rolled back (`bash bench/e2e/apply_on_gpu.sh`; "
                  f"{t['total_seconds']} s in all). Every step exited as expected: {t['all_as_expected']}; the "
                  f"installed package byte-identical afterwards: {t['installed_package_unchanged']}.", "",
                  "| command | exit (expected) | seconds |", "|---|---|---|"]
        lines += [f"| `{st['command']}` | {st['exit']} ({st['expected_exit']}) | {st['seconds']} |" for st in t["steps"]]
        lines += ["", "The transcript:", "", "```", t.get("text", "").rstrip(), "```"]
    else:
        lines += ["", "## apply-transcript", "", "Not run yet on the GPU machine."]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------- pay
PAY_TITLE = ("# DDTree at every batch size (H200, SGLang 0.5.17, Qwen3-8B shape + b16 DFlash drafter shape, "
             "CUDA graphs)")


def pay_label(cfg: dict) -> str:
    algo = cfg["algo"]
    if algo == "ar":
        return "plain"
    if algo == "chain":
        return "chain"
    budget = cfg.get("budget")
    if budget is None or not str(budget).isdigit():  # -sched: the schedule's text (or auto)
        return "ddtree-schedule" + ("-adapt" if cfg.get("adapt") else "")
    return f"ddtree-b{budget}"


def pay_rows(res: dict) -> list[dict]:
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


def pay(argv: list[str]) -> int:
    """Does DDTree pay at every batch size (issue #20): the rows of the controlled-profile and random-weight runs,
    their ratios to the chain, and the launches / host µs per round of the ``-launch`` configurations."""
    ap = argparse.ArgumentParser(prog="python -m bench.e2e.report pay",
                                 description="pay-every-batch tables from gpu_run.sh raw results of one lease")
    ap.add_argument("stem", type=Path, help="writes STEM.json and STEM.md")
    ap.add_argument("raws", type=Path, nargs="+", help="TAG-raw.tgz files (or result folders)")
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
            table[name] = {"config": res["config"], "rows": pay_rows(res)}
            if res.get("round_stats", {}).get("batches"):
                round_stats[name] = res["round_stats"]
    out: dict = {"profile": profile, "controlled": [], "random_weights": [], "ratios": {}, "failed": {}}
    for name, t in sorted(table.items()):
        if "error" in t:
            out["failed"][name] = t["error"]
            continue
        kind = "controlled" if t["config"]["modelset"] == "prof" else "random_weights"
        for r in t["rows"]:
            out[kind].append({"config": pay_label(t["config"]), "name": name, **r})
    by = {(r["config"], r["batch"]): r for r in out["controlled"]}
    for (cfg, bs), r in sorted(by.items()):
        chain = by.get(("chain", bs))
        if chain and cfg != "chain":
            out["ratios"].setdefault(cfg, {})[bs] = round(r["tok_s"] / chain["tok_s"], 3)
    lines = [PAY_TITLE, ""]
    if a.notes:
        lines += [a.notes.read_text().rstrip("\n"), ""]
    lines += [f"Reproduce: `python -m bench.e2e.report pay {' '.join(argv)}`", ""]
    if profile:
        p = ", ".join(f"{x:.4f}" for x in profile["probs"])
        ea = profile["expected_accepted"]
        lines += [f"Profile (`prof` models, bench/e2e/models/mk_profile.py): target and drafter share a context-free "
                  f"law over four tokens, P = ({p}) by drafter rank, sampled at temperature {profile['temperature']}: "
                  f"the rank-r candidate holds the target's token with probability P[r] at every depth. Expected "
                  f"tokens per round: chain {1 + ea['chain']:.2f}, "
                  + ", ".join(f"{k} {1 + v:.2f}" for k, v in ea.items() if k != "chain") + ".", ""]
    schedules = sorted({str(t["config"].get("budget")) for t in table.values()
                        if "config" in t and pay_label(t["config"]).startswith("ddtree-schedule")})
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


# ---------------------------------------------------------------------------------------------------- hybrid17
H17_BATCHES = (1, 4, 16)
Q36_BATCHES = (1, 8, 16)
Q36_ORDER = ("chain", 16, 32, 64, 128)
#: the Qwen3.6-27B-shape model sets: random weights (round cost) and the controlled acceptance profile (tok/s)
Q36_MODELSETS = ("q36", "prof36")
CONTROLLED = ("prof36",)
FITS = re.compile(r"DDTree hybrid(?: \([^)]*\))?: budget (\d+) fits .*\(largest that fits: (-?\d+) at (\d+) max running requests\)")


def kernels_section(path: Path | None) -> dict:
    if path is None or not path.exists():
        return {"run": False, "why": f"no kernel check results ({path})"}
    res = json.loads(path.read_text())
    if "cases" not in res:
        return {"run": False, "why": res.get("skipped") or "no cases"}
    keep = ("case", "ok", "max_out_err", "max_state_err", "window_exact", "walk_follows_path", "commit_is_accepted_node",
            "commit_equals_sequential_path", "sequential_max_abs_diff", "track_slot_is_tracked_node", "tracked",
            "others_untouched", "accept_len_max", "verify_s", "seconds", "error")
    return {"run": True, "ok": res["ok"], "device": res.get("device"), "gpu": res.get("gpu"), "dtype": res.get("dtype"),
            "shapes": res["shapes"], "cases": [{k: c.get(k) for k in keep if k in c} for c in res["cases"]]}


def _outs(d: dict, wl: str):
    w = (d or {}).get("workloads", {}).get(wl)
    return None if w is None else w["output_ids"]


def lossless_section(rs: dict) -> list[dict]:
    rows = []
    for name, d in sorted(rs.items()):
        cfg = d.get("config", {})
        if cfg.get("modelset") != "hyblive" or cfg.get("algo") not in ("chain", "ddtree"):
            continue
        graph = "-graph" if cfg.get("graph") else ""
        refs = {"ar": rs.get(f"hyblive-ar{graph}"), "arv": rs.get(f"hyblive-arv{graph}"),
                "ard": rs.get(f"hyblive-ard{graph}") if cfg["algo"] == "ddtree" else None,
                "chain": rs.get(f"hyblive-chain{graph}") if cfg["algo"] == "ddtree" else None}
        for bs in H17_BATCHES:
            wl = f"greedy-bs{bs}"
            mine = _outs(d, wl)
            row = {"config": name, "algo": cfg["algo"], "budget": cfg.get("budget"), "graph": bool(cfg.get("graph")),
                   "batch": bs, "ok": bool(d.get("ok")), "error": d.get("error")}
            if mine is not None:
                meta = d["workloads"][wl]["meta"]
                v = sum((m.get("spec_verify_ct") or 0) for m in meta)
                a = sum((m.get("spec_accepted_drafts") or 0) for m in meta)
                row["tokens_per_round"] = round((a + v) / v, 3) if v else None
            for ref, rd in refs.items():
                theirs = _outs(rd, wl)
                if mine is None or theirs is None:
                    row[f"vs_{ref}"] = None
                    continue
                div = driver.first_divergences(mine, theirs)
                row[f"vs_{ref}"] = {"identical": all(x is None for x in div) and len(mine) == len(theirs),
                                    "requests": len(mine), "identical_requests": sum(x is None for x in div),
                                    "first_divergence": [x for x in div if x is not None][:6]}
            rows.append(row)
    return rows


def _fits_from_logs(raw: Path) -> dict[str, dict]:
    out = {}
    for log in sorted((raw / "logs").glob("q36-*.log")):
        found = list(FITS.finditer(log.read_text(errors="replace")))
        m = found[-1] if found else None
        if m:
            out[log.stem] = {"budget": int(m.group(1)), "largest_fit": int(m.group(2)), "max_running": int(m.group(3))}
        else:
            txt = log.read_text(errors="replace")
            refused = re.search(r"DDTree on a hybrid target[^\n]*", txt)
            if refused:
                out[log.stem] = {"refused": refused.group(0)[:600]}
    return out


PASS = re.compile(r"-p(\d+)$")


def merge_passes(rs: dict) -> dict:
    """Configurations measured in several passes of one lease (NAME-p1, NAME-p2, ...) as one NAME: their speed
    runs concatenated (each run keeps its pass), ok only if every pass is, the first error."""
    out: dict = {}
    for name, d in sorted(rs.items()):
        m = PASS.search(name)
        if not m:
            out[name] = d
            continue
        base = name[: m.start()]
        cur = out.setdefault(base, {"config": {**d.get("config", {}), "name": base}, "ok": True, "workloads": {},
                                    "passes": []})
        cur["passes"].append(int(m.group(1)))
        cur["ok"] = cur["ok"] and bool(d.get("ok"))
        if d.get("error") and not cur.get("error"):
            cur["error"] = d["error"]
        for wl, runs in d.get("workloads", {}).items():
            if wl.startswith("speed") and isinstance(runs, list):
                cur["workloads"].setdefault(wl, []).extend({**r, "pass": int(m.group(1))} for r in runs)
    return out


def round_section(rs: dict, raw: Path) -> dict:
    shares = gdn_share.run(raw)
    fits = _fits_from_logs(raw)
    rows = []
    for name, d in sorted(merge_passes(rs).items()):
        cfg = d.get("config", {})
        if cfg.get("modelset") not in Q36_MODELSETS:
            continue
        key = "chain" if cfg["algo"] == "chain" else cfg.get("budget")
        for bs in Q36_BATCHES:
            runs = d.get("workloads", {}).get(f"speed-bs{bs}")
            row = {"config": name, "modelset": cfg["modelset"], "variant": key, "batch": bs,
                   "max_running": cfg.get("max_running"), "ok": bool(d.get("ok")), "error": d.get("error")}
            if runs:
                rms = sorted(r["round_ms"] for r in runs if r.get("round_ms") is not None)
                tps = sorted(r["tok_per_s"] for r in runs)
                v = sum((m.get("spec_verify_ct") or 0) for r in runs for m in r["meta"])
                a = sum((m.get("spec_accepted_drafts") or 0) for r in runs for m in r["meta"])
                row.update(round_ms=rms[len(rms) // 2] if rms else None, round_ms_all=rms,
                           tok_per_s=tps[len(tps) // 2], tokens_per_round=round((a + v) / v, 3) if v else None)
                if d.get("passes"):  # drift between the passes: each pass's median round
                    by = {}
                    for r in runs:
                        if r.get("round_ms") is not None:
                            by.setdefault(r["pass"], []).append(r["round_ms"])
                    row["round_ms_by_pass"] = {str(k): sorted(v)[len(v) // 2] for k, v in sorted(by.items())}
            sh = shares.get(name, {}).get(f"bs{bs}")
            if sh:
                row.update(gdn_verify_share=sh["gdn_verify_share"], gdn_commit_share=sh["gdn_commit_share"],
                           kernel_ms_per_round_profiled=sh["kernel_ms_per_round"],
                           gdn_verify_ms_per_round_profiled=sh["gdn_verify_ms_per_round"])
            elif cfg.get("max_running") is not None and bs > cfg["max_running"]:
                row["not_run"] = (f"batch {bs} > {cfg['max_running']} max running requests: budget {key}'s per-node "
                                  "states for more requests do not fit one H200 next to the 27B weights")
            if "round_ms" in row or "not_run" in row or row["error"]:
                rows.append(row)
    chain = {(r["modelset"], r["batch"]): r for r in rows if r["variant"] == "chain"}
    for r in rows:
        c = chain.get((r["modelset"], r["batch"]), {})
        if r.get("round_ms") and c.get("round_ms"):
            r["round_vs_chain"] = round(r["round_ms"] / c["round_ms"], 3)
        if r["modelset"] in CONTROLLED and r.get("tok_per_s") and c.get("tok_per_s"):
            r["tok_per_s_vs_chain"] = round(r["tok_per_s"] / c["tok_per_s"], 3)
    return {"rows": rows, "memory_check": fits, "gdn_share": shares}


def render_hybrid17(s: dict) -> str:
    L = ["# DDTree on hybrid GatedDeltaNet targets, SGLang 0.5.17, H200 (issue #15)", ""]
    k = s["kernels"]
    L += ["## Kernel checks (the wired verify + commit vs float64 per-path recurrences)", ""]
    if not k["run"]:
        L += [f"Not run: {k['why']}", ""]
    else:
        sh = k["shapes"]
        L += [f"Device {k.get('gpu') or k['device']}, activations {k.get('dtype')}, GDN heads {sh['num_k_heads']} key / "
              f"{sh['num_v_heads']} value, head dims {sh['head_k_dim']}/{sh['head_v_dim']}, conv {sh['conv_kernel']}. "
              f"All pass: **{k['ok']}**.", "",
              "| case | ok | out err | state err | windows exact | commit = sequential | track | accept max | s |",
              "|---|---|---|---|---|---|---|---|---|"]
        for c in k["cases"]:
            L.append(f"| {c['case']} | {c['ok']} | {c.get('max_out_err', 0):.2e} | {c.get('max_state_err', 0):.2e} | "
                     f"{c.get('window_exact')} | {c.get('commit_equals_sequential_path')} | "
                     f"{c.get('track_slot_is_tracked_node')} ({c.get('tracked', 0)}) | {c.get('accept_len_max')} | "
                     f"{c.get('seconds')} |" + (f" {c['error']}" if c.get("error") else ""))
        L.append("")

    def same(v):
        return "-" if v is None else ("yes" if v["identical"] else f"no ({v['identical_requests']}/{v['requests']})")

    L += ["## Lossless (hyblive, greedy output ids)", "",
          "| config | batch | = plain | = plain, verify math | = plain, DDTree math | = stock chain | tokens/round |",
          "|---|---|---|---|---|---|---|"]
    for r in s["lossless"]:
        L.append(f"| {r['config']} | {r['batch']} | {same(r.get('vs_ar'))} | {same(r.get('vs_arv'))} | "
                 f"{same(r.get('vs_ard'))} | {same(r.get('vs_chain'))} | {r.get('tokens_per_round')} |"
                 + ("" if r["ok"] else f" {r['error']}"))
    L += ["", "## Qwen3.6-27B shape: round milliseconds (dummy weights, CUDA graphs)", "",
          "| variant | batch | round ms | vs chain | tokens/round | tok/s | GDN verify share | max running |",
          "|---|---|---|---|---|---|---|---|"]
    order = {v: i for i, v in enumerate(Q36_ORDER)}
    rows = sorted(s["round_27b"]["rows"], key=lambda r: (order.get(r["variant"], 99), r["batch"]))
    for r in (r for r in rows if r.get("modelset", "q36") not in CONTROLLED):
        if "not_run" in r:
            L.append(f"| {r['variant']} | {r['batch']} | not run | | | | | {r['max_running']} |")
            continue
        share = r.get("gdn_verify_share")
        passes = r.get("round_ms_by_pass")
        rms = r.get("round_ms") if not passes else f"{r.get('round_ms')} (passes: {' / '.join(map(str, passes.values()))})"
        L.append(f"| {r['variant']} | {r['batch']} | {rms} | {r.get('round_vs_chain')} | "
                 f"{r.get('tokens_per_round')} | {r.get('tok_per_s')} | "
                 f"{'-' if share is None else f'{share:.1%}'} | {r['max_running']} |"
                 + ("" if r["ok"] else f" {r['error']}"))
    controlled = [r for r in rows if r.get("modelset") in CONTROLLED]
    if controlled:
        L += ["", "## Qwen3.6-27B shape, controlled acceptance (models/mk_profile.py prof36, T = 1, CUDA graphs): "
              "tok/s against the chain", "",
              "| variant | batch | tok/s | vs chain | tokens/round | round ms | round vs chain | max running |",
              "|---|---|---|---|---|---|---|---|"]
        for r in controlled:
            if "not_run" in r:
                L.append(f"| {r['variant']} | {r['batch']} | not run | | | | | {r['max_running']} |")
                continue
            L.append(f"| {r['variant']} | {r['batch']} | {r.get('tok_per_s')} | {r.get('tok_per_s_vs_chain')} | "
                     f"{r.get('tokens_per_round')} | {r.get('round_ms')} | {r.get('round_vs_chain')} | "
                     f"{r['max_running']} |" + ("" if r["ok"] else f" {r['error']}"))
    failed = {n: c for n, c in sorted(s.get("configs", {}).items()) if not c.get("ok")}
    if failed:  # every configuration that did not finish, with its error (an engine that died at start-up too)
        L += ["", "## Configurations that did not finish (start-up failures with the engine's error)", ""]
        L += [f"- `{n}`: {c.get('error') or 'no error recorded'}" for n, c in failed.items()]
    if s["round_27b"]["memory_check"]:
        L += ["", "Start-up memory check (the server's log): " + "; ".join(
            f"{n}: " + (f"largest budget {v['largest_fit']} at {v['max_running']} requests" if "largest_fit" in v
                        else v["refused"]) for n, v in sorted(s["round_27b"]["memory_check"].items()))]
    return "\n".join(L) + "\n"


def hybrid17(argv: list[str]) -> int:
    """Issue #15's proof on SGLang 0.5.17: kernels, hyblive lossless, the Qwen3.6-27B shape's rounds."""
    ap = argparse.ArgumentParser(prog="python -m bench.e2e.report hybrid17",
                                 description="hybrid GatedDeltaNet DDTree on 0.5.17 from hybrid17.sh raw results")
    ap.add_argument("stem", type=Path, help="writes STEM.json and STEM.md")
    ap.add_argument("raws", type=Path, nargs="+", help="TAG-raw.tgz files (or result folders); later ones win")
    ap.add_argument("--kernels", type=Path, help="tests/gpu/test_hybrid_v2_kernels_gpu.py's JSON (default: "
                    "hybrid_v2_kernels.json beside the first RAW)")
    a = ap.parse_args(argv)
    kernels = a.kernels if a.kernels is not None else a.raws[0].parent / "hybrid_v2_kernels.json"
    raw = merge_raws(a.raws)
    rs = load_results(raw)
    summary = {"kernels": kernels_section(kernels), "lossless": lossless_section(rs), "round_27b": round_section(rs, raw),
               "configs": {n: {k: d.get(k) for k in ("ok", "error", "startup_s", "total_s")} for n, d in rs.items()}}
    out_json, out_md = result_paths(a.stem)
    out_json.write_text(json.dumps(summary, indent=1))
    out_md.write_text(render_hybrid17(summary))
    print(render_hybrid17(summary))
    return 0


COMMANDS = {"sweep": sweep, "hybrid": hybrid, "spec-v2": spec_v2, "pay": pay, "hybrid17": hybrid17}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(__doc__.split("\n\n")[1])
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
