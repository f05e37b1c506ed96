"""The `sweep` report: one gpu_run.sh call on SGLang 0.5.11: lossless, the T > 0 fit, speed and round share
(bench/results/e2e-lossless-speed*.{json,md})

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
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.e2e import chisq, driver
from bench.e2e.e2e_files import load_results, open_raw
from bench.e2e.workloads import prompts

E2E = Path(__file__).resolve().parents[1]  # bench/e2e


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
        subprocess.run([sys.executable, "-m", "bench.e2e.models.mk_models", str(models)], check=True,
                       capture_output=True, cwd=E2E.parent.parent)
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


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.e2e.report sweep",
                                 description="one gpu_run.sh call on SGLang 0.5.11: e2e-NAME.{json,md} and companions")
    ap.add_argument("files", type=Path)
    ap.add_argument("--tag", default=None, help="TAG given to gpu_run.sh (default: from the *-raw.tgz name)")
    ap.add_argument("--results", type=Path, default=E2E / "results")
    ap.add_argument("--models", type=Path, default=Path("/tmp/models"),
                    help="holds (or gets) models/mk_models.py's output")
    ap.add_argument("--name", default="lossless-speed", help="results are named e2e-NAME*")
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
