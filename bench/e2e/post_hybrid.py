"""Tables for the hybrid (issue #9) H200 runs: DDTree on GatedDeltaNet targets against every baseline.

Usage: python bench/e2e/post_hybrid.py OUT_JSON RAW.tgz [RAW.tgz ...]
Each RAW.tgz is a `gpu_run.sh` result tarball (per-configuration JSON + logs). Configurations of the same name in
several tarballs are kept apart (`<tarball tag>:<name>`), which also checks that greedy output is the same across
machine leases. Writes OUT_JSON and OUT_JSON with .md: for every speculative configuration (chain, DDTree) its
greedy outputs against the model set's baselines:
  ar   plain decoding as SGLang ships it (GDN decode = packed kernel, beta rounded to bf16)
  arv  plain decoding with the verify kernel's GDN math (bench/e2e/gdn_unpacked_decode)
  chain  the stock DFlash chain
plus acceptance per round and the start-up errors found in the logs (the budget-memory check).
"""
from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

WORKLOADS = ("greedy-bs1", "greedy-bs4", "greedy-bs16")


def load(tgz: Path) -> tuple[dict, dict]:
    """(configs by name, start-up errors by name) from one result tarball."""
    tag = re.sub(r"^e2e-raw-|-raw$", "", tgz.name.removesuffix(".tgz"))  # e2e-raw-hyb1.tgz / hyb-raw.tgz
    out, errors = {}, {}
    with tarfile.open(tgz) as tf:
        for m in tf.getmembers():
            name = Path(m.name).name
            if m.isfile() and name.endswith(".json") and "/" not in m.name.lstrip("./"):
                d = json.loads(tf.extractfile(m).read())
                if "config" in d:
                    out[f"{tag}:{d['config']['name']}"] = d
            elif m.isfile() and name.endswith(".log") and "/logs/" in "/" + m.name.lstrip("./"):
                text = tf.extractfile(m).read().decode(errors="replace")
                hit = re.findall(r"ValueError: (DDTree budget .*?largest budget that fits is \d+[^\n]*)", text)
                if hit:
                    errors[f"{tag}:{name[:-4]}"] = hit[-1]
    return out, errors


def first_divergences(a: list, b: list) -> list:
    res = []
    for x, y in zip(a, b, strict=True):
        k = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
        if k is None and len(x) != len(y):
            k = min(len(x), len(y))
        res.append(k)
    return res


def main() -> int:
    out_json = Path(sys.argv[1])
    runs, errors = {}, {}
    for t in sys.argv[2:]:
        r, e = load(Path(t))
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
                    for wl in WORKLOADS:
                        a = ok[key]["workloads"].get(wl, {}).get("output_ids")
                        b = ok[bkey]["workloads"].get(wl, {}).get("output_ids")
                        if a is None or b is None:
                            continue
                        fd = first_divergences(a, b)
                        rows.append({"config": key, "baseline": bkey, "workload": wl, "requests": len(a),
                                     "identical_requests": sum(k is None for k in fd),
                                     "first_divergence": [k for k in fd if k is not None]})
        for wl in WORKLOADS:
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
                       for k in ks[1:] for wl in WORKLOADS if wl in ok[ks[0]]["workloads"])
            cross.append({"config": n, "runs": ks, "identical": same})
    summary = {"rows": rows, "acceptance": acceptance, "cross_lease": cross, "startup_errors": errors,
               "failed": {k: v.get("error") for k, v in runs.items() if not v.get("ok")}}
    out_json.write_text(json.dumps(summary, indent=1))

    lines = ["# Hybrid (GatedDeltaNet) DDTree on the H200: generated tables", "",
             f"Generated by `bench/e2e/post_hybrid.py` from {', '.join(Path(t).name for t in sys.argv[2:])}.", "",
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


if __name__ == "__main__":
    sys.exit(main())
