"""The `hybrid-v2` report: DDTree on hybrid GatedDeltaNet targets on the spec-v2 worker of SGLang 0.5.17 (issue
#15), bench/results/hybrid-0.5.17-h200*.{md,json}

  RAW: TAG-raw.tgz (or result folders) of `bench/e2e/hybrid_v2.sh` parts, with TAG-prof.tgz beside it when the part
  profiled; configurations of the same name in a later RAW replace earlier ones. KERNELS_JSON:
  tests/gpu/test_hybrid_v2_kernels_gpu.py's output (hybrid_v2.sh writes it as $OUT/hybrid_v2_kernels.json); default:
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

import json
import re
from pathlib import Path

from bench.e2e import driver, gdn_share
from bench.e2e.e2e_files import load_results, merge_raws, result_paths
from bench.e2e.reports import stem_and_raws


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


def render(s: dict) -> str:
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


def main(argv: list[str]) -> int:
    """Issue #15's proof on SGLang 0.5.17: kernels, hyblive lossless, the Qwen3.6-27B shape's rounds."""
    ap = stem_and_raws("hybrid-v2", "hybrid GatedDeltaNet DDTree on 0.5.17 from hybrid_v2.sh raw results",
                       "TAG-raw.tgz files (or result folders); later ones win")
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
    out_md.write_text(render(summary))
    print(render(summary))
    return 0
