"""Share of a DDTree round spent in the DDTree steps, from SGLang's own torch-profiler traces (in situ, real server).

Usage: python -m bench.e2e.round_share RAW_DIR_OR_TGZ OUT_JSON
  RAW_DIR_OR_TGZ: the e2e driver's result folder (or its tarball) with prof/NAME-bsN/*.trace.json.gz from a `-prof`
  configuration and NAME.json beside it (for the un-profiled round time of the same engine's speed runs).

Why Python stacks: the DDTree steps are a mix of our Triton kernels and plain torch ops (argmax, index_select, the
host commit loop), and the scheduler runs in a subprocess, so CUDA events in the driver cannot time them. The trace
has every Python frame of the scheduler thread (`python_function`), every launch (`cuda_runtime` / `cuda_driver`) and
every GPU activity (`kernel`, `gpu_memcpy`, `gpu_memset`) with the launch's correlation id. A GPU activity belongs to
the innermost Python frame around its launch, and that frame's category is the first rule in RULES that matches it
or one of its callers (innermost first). A round is one `forward_batch_generation` call of the DFlash worker that
drafts: on the spec-v1 worker of 0.5.11 (`dflash_worker.py`) it calls `_prepare_for_speculative_decoding`; on the
spec-v2 worker of 0.5.14+ (`dflash_worker_v2.py`, the hybrid runs) the decode round is inline in that call, which
calls `_ensure_draft_block_buffers` and runs the drafter's `model_runner.forward` itself (the target's goes through
`tp_worker.py`), and DDTree's part of the round is `ddtree_v2/round.py` (`finish_round`). Prefill calls are left
out. Kernels inside a replayed CUDA graph carry the graph launch's correlation, so they land in `target_forward` /
`draft_forward`. On hybrids, the GatedDeltaNet layers' tree verify of an eager target forward
(`ddtree_v2/hybrid.py`: `TreeVerify.forward`) is `gdn_tree_verify` and the accepted node's state commit
(`hybrid.commit`) `hybrid_commit`; the runtime's tree-recurrent kernels take the category of their caller.

Reported per trace and round: GPU time per category (sum of activity durations, and the busy union of the whole
round), host time per category (exclusive Python time; inflated by the profiler's Python tracer, shares are what
count), the round's wall time under the profiler and, from the speed runs, without it. Traces without Python frames
fall back to the DDTree Triton kernels' names (GPU time only).
"""
from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from bench.e2e.e2e_files import open_raw


def _spec_v1_input(f: str) -> bool:
    """A frame in a spec-v1 verify input's file: DFLASH's own (dflash_info.py), or DDTree's on 0.5.11 (ddtree_info.py,
    vendored from patches/ddtree/spec-v1/; traces recorded before it was vendored have it in dflash_info.py)."""
    return "dflash_info" in f or "ddtree_info" in f


# (category, test on (file, function)); the first match from the innermost frame outwards wins.
RULES: list[tuple[str, object]] = [
    ("hybrid_commit", lambda f, fn: "ddtree_hybrid" in f or fn == "_update_target_mamba_state_after_verify"
     or ("ddtree_v2/hybrid" in f and fn == "commit")),
    ("gdn_tree_verify", lambda f, fn: "ddtree_v2/hybrid" in f and fn in ("forward", "tree_layer", "gdn_gating")),
    ("draft_topk", lambda f, fn: fn == "ddtree_draft_topk" or "ddtree/topk" in f or "ddtree_v2/draft_topk" in f),
    ("build_tree", lambda f, fn: ("ddtree/tree" in f and "tree_recurrent" not in f) or fn.startswith("build_tree")),
    ("verify_inputs", lambda f, fn: "ddtree/verify" in f or fn.startswith("build_verify_inputs")
     or "ddtree_v2/verify_input" in f),
    ("mask", lambda f, fn: fn == "build_ddtree_verify_mask" or fn.startswith("expand_tree_mask")
     or ("ddtree_v2/round" in f and fn == "verify_mask")),
    ("sampling", lambda f, fn: fn == "sample_target_tokens_per_node" or "ddtree/sample" in f
     or "ddtree_v2/sampling" in f),
    ("walk", lambda f, fn: "ddtree/walk" in f or fn.startswith("accept_walk")),
    ("kv_compaction", lambda f, fn: fn == "accepted_kv_and_hidden_index" or "ddtree/compaction" in f),
    ("verify_prepare_other", lambda f, fn: fn == "prepare_for_verify" and _spec_v1_input(f)),
    ("verify_commit_other", lambda f, fn: fn == "verify" and _spec_v1_input(f)),
    ("ddtree_glue", lambda f, fn: fn in ("prepare_ddtree_verify", "_prepare_ddtree_verify") or "ddtree_v2/round" in f),
    ("draft_kv_append", lambda f, fn: fn == "_append_target_hidden_to_draft_kv"),
    ("model_forward", lambda f, fn: "model_runner" in f and fn in ("forward", "_forward_raw")),
    ("draft_other", lambda f, fn: fn == "_prepare_for_speculative_decoding"),
    ("target_other", lambda f, fn: fn == "forward_batch_generation" and "tp_worker" in f),
]
# The brief's "DDTree runtime" steps, and everything the DDTree round adds around them.
DDTREE_CORE = ("draft_topk", "build_tree", "verify_inputs", "mask", "sampling", "walk", "kv_compaction")
DDTREE_ALL = DDTREE_CORE + ("verify_prepare_other", "verify_commit_other", "ddtree_glue", "hybrid_commit")
# Fallback without Python frames: our Triton kernels by name.
KERNEL_NAMES = {"_chunk_topk_kernel": "draft_topk", "_split_topk_kernel": "draft_topk",
                "_merge_splits_kernel": "draft_topk", "_build_tree_kernel": "build_tree", "_verify_kernel": "verify_inputs",
                "_ddtree_expand_mask_kernel": "mask", "_sample_kernel": "sampling", "_walk_kernel": "walk",
                "_compaction_kernel": "kv_compaction"}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: A call of these inside the DFlash worker's forward_batch_generation makes it a decode round: spec-v1 (0.5.11)
#: drafts in _prepare_for_speculative_decoding; spec-v2 (0.5.14+) sizes its draft block buffers first.
ROUND_MARKERS = ("_prepare_for_speculative_decoding", "_ensure_draft_block_buffers")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def split_frame(name: str) -> tuple[str, str]:
    """'sglang/srt/x.py(12): func' -> ('sglang/srt/x.py', 'func'); C calls keep their whole name as function."""
    if "): " in name:
        head, fn = name.split("): ", 1)
        return head.rsplit("(", 1)[0].replace("\\", "/"), fn
    return "", name


def rule_of(name: str) -> str | None:
    f, fn = split_frame(name)
    for cat, test in RULES:
        if test(f, fn):  # type: ignore[operator]
            return cat
    return None


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        d = json.load(fh)
    return d["traceEvents"] if isinstance(d, dict) else d


def _nest(pys: list[dict]) -> None:
    """Set e['_parent'] (index into pys or None) for python events of one thread; they nest properly."""
    stack: list[int] = []
    for i, e in enumerate(pys):
        while stack and pys[stack[-1]]["ts"] + pys[stack[-1]]["dur"] <= e["ts"]:  # ended: a sibling, not a parent
            stack.pop()
        e["_parent"] = stack[-1] if stack else None
        stack.append(i)


def _innermost(pys: list[dict], starts: list[float], t: float) -> int | None:
    """Index of the innermost python event containing time t (binary search on start, then walk up parents)."""
    lo, hi = 0, len(starts)
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    i = lo - 1
    while i is not None and i >= 0:
        e = pys[i]
        if e["ts"] <= t <= e["ts"] + e["dur"]:
            return i
        i = e["_parent"]
    return None


def _chain_category(pys: list[dict], i: int | None, cache: dict[int, tuple[str | None, int | None]]):
    """(category, round index) for python event i: first matching rule from i outwards, and the enclosing round."""
    if i is None:
        return None, None
    if i in cache:
        return cache[i]
    e = pys[i]
    pcat, pround = _chain_category(pys, e["_parent"], cache)
    own = e["_rule"]
    rnd = i if e.get("_is_round") else pround
    if own == "model_forward":
        own = "draft_forward" if e.get("_in_draft") else "target_forward"
    cat = own if own is not None else pcat
    cache[i] = (cat, rnd)
    return cache[i]


def union_us(iv: list[tuple[float, float]]) -> float:
    tot, end = 0.0, float("-inf")
    for a, b in sorted(iv):
        if b <= end:
            continue
        tot += b - max(a, end)
        end = b
    return tot


def analyse(events: list[dict]) -> dict:
    by_tid: dict[tuple, list[dict]] = defaultdict(list)
    launches: dict[int, dict] = {}
    gpu: list[dict] = []
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X":
            continue
        if cat == "python_function":
            by_tid[(e["pid"], e["tid"])].append(e)
        elif cat in LAUNCH_CATS and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e
        elif cat in GPU_CATS:
            gpu.append(e)
    if not by_tid:
        return analyse_by_names(gpu)
    frames: dict[tuple, tuple[list[dict], list[float]]] = {}
    for key, pys in by_tid.items():
        pys.sort(key=lambda e: (e["ts"], -e["dur"]))
        _nest(pys)
        for e in pys:
            e["_rule"] = rule_of(e["name"])
            e["_excl"] = e["dur"]
        for e in pys:
            if e["_parent"] is not None:
                pys[e["_parent"]]["_excl"] -= e["dur"]
        # rounds: the worker's forward_batch_generation that drafts; draft forwards: model forward under drafting
        for e in pys:
            if split_frame(e["name"])[1] in ROUND_MARKERS:
                j = e["_parent"]
                while j is not None:
                    pf, pfn = split_frame(pys[j]["name"])
                    if pfn == "forward_batch_generation" and "dflash_worker" in pf:
                        pys[j]["_is_round"] = True
                        break
                    j = pys[j]["_parent"]
        for e in pys:  # parents precede children in this order
            p = e["_parent"]
            e["_in_draft"] = p is not None and bool(
                pys[p].get("_in_draft") or split_frame(pys[p]["name"])[1] == "_prepare_for_speculative_decoding"
                or (pys[p].get("_is_round") and e["_rule"] == "model_forward"))  # spec-v2: the drafter's forward
        frames[key] = (pys, [e["ts"] for e in pys])

    rounds: dict[tuple, dict] = {}
    caches: dict[tuple, dict] = {k: {} for k in frames}
    for key, (pys, _) in frames.items():
        for i, e in enumerate(pys):
            cat, rnd = _chain_category(pys, i, caches[key])
            if rnd is None:
                continue
            r = rounds.setdefault((key, rnd), {"wall_us": pys[rnd]["dur"], "host_us": defaultdict(float),
                                               "gpu_us": defaultdict(float), "kernels": defaultdict(float),
                                               "iv": []})
            r["host_us"][cat or "round_other"] += e["_excl"]
    unattributed = 0.0
    for g in gpu:
        corr = g.get("args", {}).get("correlation")
        ln = launches.get(corr)
        if ln is None or (ln["pid"], ln["tid"]) not in frames:
            unattributed += g["dur"]
            continue
        key = (ln["pid"], ln["tid"])
        pys, starts = frames[key]
        i = _innermost(pys, starts, ln["ts"])
        cat, rnd = _chain_category(pys, i, caches[key])
        if rnd is None:
            continue  # prefill or outside any round
        r = rounds[(key, rnd)]
        cat = cat or "round_other"
        r["gpu_us"][cat] += g["dur"]
        r["kernels"][(cat, g["name"][:80])] += g["dur"]
        r["iv"].append((g["ts"], g["ts"] + g["dur"]))
    return summarise(list(rounds.values()), method="python-stacks", unattributed_gpu_us=unattributed)


def summarise(rounds: list[dict], *, method: str, unattributed_gpu_us: float = 0.0) -> dict:
    n = len(rounds)
    if n == 0:
        return {"method": method, "rounds": 0, "error": "no DDTree decode round found in the trace"}
    gpu_sum = [sum(r["gpu_us"].values()) for r in rounds]
    busy = [union_us(r["iv"]) for r in rounds]
    wall = [r["wall_us"] for r in rounds if r.get("wall_us") is not None]
    cats = sorted({c for r in rounds for c in list(r["gpu_us"]) + list(r["host_us"])})
    tot_gpu = sum(gpu_sum)
    tot_host = sum(sum(r["host_us"].values()) for r in rounds)
    out_c = {}
    for c in cats:
        g = sum(r["gpu_us"].get(c, 0.0) for r in rounds)
        h = sum(r["host_us"].get(c, 0.0) for r in rounds)
        ks: dict[str, float] = defaultdict(float)
        for r in rounds:
            for (kc, kn), v in r["kernels"].items():
                if kc == c:
                    ks[kn] += v
        out_c[c] = {"gpu_us_per_round": round(g / n, 2), "share_of_round_gpu": round(g / tot_gpu, 4) if tot_gpu else None,
                    "host_us_per_round_profiled": round(h / n, 1),
                    "share_of_round_host": round(h / tot_host, 4) if tot_host else None,
                    "top_kernels_us_per_round": {k: round(v / n, 2) for k, v in
                                                 sorted(ks.items(), key=lambda kv: -kv[1])[:6]}}

    def group(names: tuple[str, ...]) -> dict:
        g = sum(out_c[c]["gpu_us_per_round"] for c in names if c in out_c)
        h = sum(out_c[c]["host_us_per_round_profiled"] for c in names if c in out_c)
        return {"gpu_us_per_round": round(g, 2), "share_of_round_gpu": round(g * n / tot_gpu, 4) if tot_gpu else None,
                "host_us_per_round_profiled": round(h, 1),
                "share_of_round_host": round(h * n / tot_host, 4) if tot_host else None}

    return {"method": method, "rounds": n,
            "wall_us_per_round_profiled": {"median": round(statistics.median(wall), 1),
                                           "mean": round(statistics.mean(wall), 1)} if wall else None,
            "gpu_us_per_round": {"kernel_sum_median": round(statistics.median(gpu_sum), 1),
                                 "busy_union_median": round(statistics.median(busy), 1)},
            "ddtree_core": group(DDTREE_CORE), "ddtree_all": group(DDTREE_ALL), "categories": out_c,
            "gpu_us_outside_known_launches": round(unattributed_gpu_us, 1)}


def analyse_by_names(gpu: list[dict]) -> dict:
    """No Python frames: rounds start at each `_build_tree_kernel`; only our Triton kernels are named."""
    gpu = sorted(gpu, key=lambda g: g["ts"])
    marks = [g["ts"] for g in gpu if g["name"] == "_build_tree_kernel"]
    rounds = []
    for a, b in zip(marks, marks[1:] + [float("inf")], strict=True):
        r = {"wall_us": None, "host_us": {}, "gpu_us": defaultdict(float), "kernels": defaultdict(float), "iv": []}
        for g in gpu:
            if a - 1e-9 <= g["ts"] < b:
                cat = KERNEL_NAMES.get(g["name"], "other")
                r["gpu_us"][cat] += g["dur"]
                r["kernels"][(cat, g["name"][:80])] += g["dur"]
                r["iv"].append((g["ts"], g["ts"] + g["dur"]))
        rounds.append(r)
    # The last "round" runs to the end of the trace and may hold the next prefill: drop it when there are others.
    return summarise(rounds[:-1] if len(rounds) > 1 else rounds, method="kernel-names (no Python frames)")


def unprofiled_round_us(res: dict, bs: int) -> float | None:
    """Median over the speed runs of (call seconds / decode rounds); rounds = the longest request's verify count."""
    runs = res.get("workloads", {}).get(f"speed-bs{bs}")
    if not runs:
        return None
    per = []
    for r in runs:
        rounds = max((m.get("spec_verify_ct") or 0) for m in r["meta"])
        if rounds:
            per.append(r["seconds"] * 1e6 / rounds)
    return round(statistics.median(per), 1) if per else None


def run(src: Path) -> dict:
    root = open_raw(src)
    out: dict = {"traces": {}}
    for d in sorted((root / "prof").glob("*-bs*")):
        files = sorted(d.glob("*.trace.json*"))
        name, bs = d.name.rsplit("-bs", 1)
        key = d.name
        if not files:
            out["traces"][key] = {"error": "no trace file"}
            continue
        events = []
        for f in files:
            events += load_events(f)
        a = analyse(events)
        a["trace_files"] = [f.name for f in files]
        resf = root / f"{name}.json"
        if resf.exists():
            res = json.loads(resf.read_text())
            w = unprofiled_round_us(res, int(bs))
            a["wall_us_per_round_unprofiled"] = w
            if w and a.get("rounds"):
                for grp in ("ddtree_core", "ddtree_all"):
                    a[grp]["gpu_share_of_unprofiled_wall"] = round(a[grp]["gpu_us_per_round"] / w, 4)
                a["gpu_busy_share_of_unprofiled_wall"] = round(a["gpu_us_per_round"]["busy_union_median"] / w, 4)
            prof = res.get("workloads", {}).get("profile", {}).get(f"bs{bs}", {})
            if prof.get("meta"):
                a["profiled_call"] = {"seconds": prof["seconds"],
                                      "verify_rounds": max((m.get("spec_verify_ct") or 0) for m in prof["meta"])}
        out["traces"][key] = a
    return out


def main() -> int:
    out = run(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
    for k, a in out["traces"].items():
        if not a.get("rounds"):
            print(k, a.get("error"))
            continue
        print(f"{k}: {a['rounds']} rounds ({a['method']}); round wall {a.get('wall_us_per_round_unprofiled')} us "
              f"unprofiled, {a['wall_us_per_round_profiled']} profiled; GPU {a['gpu_us_per_round']} us; "
              f"DDTree core GPU {a['ddtree_core']['gpu_us_per_round']} us "
              f"({a['ddtree_core']['share_of_round_gpu']} of the round's GPU time), host share "
              f"{a['ddtree_all']['share_of_round_host']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
