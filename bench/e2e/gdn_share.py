"""Share of a hybrid target's decode round spent in the GatedDeltaNet verify, from SGLang's torch-profiler traces.

Usage: python -m bench.e2e.gdn_share RAW_DIR_OR_TGZ OUT_JSON
  RAW_DIR_OR_TGZ: the e2e driver's results (or gpu_run.sh's TAG-raw.tgz) with prof/NAME-bsN/*.trace.json.gz from `-prof`
  configurations and NAME.json beside them.

GPU kernels are grouped by name (kernels replayed from a CUDA graph appear in the trace one by one, so this works
with graphs on; Python stacks are not needed):
  gdn_verify  the GatedDeltaNet layers' TARGET_VERIFY: DDTree's tree kernels (``_tree_conv_kernel``,
              ``_tree_gdn_kernel``, ``fused_gdn_gating_kernel``) or the chain's (``_causal_conv1d_update_kernel``,
              ``fused_sigmoid_gating_delta_rule_update_kernel``)
  gdn_commit  the state commit after the walk (DDTree: ``_commit_kernel``; chain: the base's fused scatters)
  other       everything else (attention, MLPs, the drafter, the DDTree tree build and walk, ...)
Per trace: kernel milliseconds per verify round (the profiled call's rounds from its meta) and the shares of the
total kernel time. The profiled call includes its one prompt prefill (a few percent of a 32-token call).
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from bench.e2e.e2e_files import open_raw

GROUPS = {
    "gdn_verify": ("_tree_conv_kernel", "_tree_gdn_kernel", "fused_gdn_gating_kernel", "_causal_conv1d_update_kernel",
                   "fused_sigmoid_gating_delta_rule_update_kernel"),
    "gdn_commit": ("_commit_kernel", "fused_mamba_state_scatter", "fused_conv_window_scatter"),
}


def group_of(kernel: str) -> str:
    for g, names in GROUPS.items():
        if any(n in kernel for n in names):
            return g
    return "other"


def trace_kernels(path: Path) -> dict[str, float]:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh).get("traceEvents", [])
    us: dict[str, float] = {"gdn_verify": 0.0, "gdn_commit": 0.0, "other": 0.0}
    for e in events:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            us[group_of(e.get("name", ""))] += float(e.get("dur", 0.0))
    return us


def run(src: Path) -> dict:
    raw = open_raw(src)
    out: dict = {}
    for res_file in sorted(raw.glob("*.json")):
        try:
            res = json.loads(res_file.read_text())
        except ValueError:
            continue
        prof = (res.get("workloads") or {}).get("profile") or {}
        name = (res.get("config") or {}).get("name")
        for key, p in prof.items():
            if "dir" not in p:
                continue
            traces = sorted((raw / p["dir"]).glob("*.trace.json*"))
            rounds = max((m.get("spec_verify_ct") or max(m.get("completion_tokens", 1) - 1, 1)) for m in p["meta"])
            if not traces or not rounds:
                continue
            us = trace_kernels(traces[0])
            total = sum(us.values())
            out.setdefault(name, {})[key] = {
                "rounds": rounds, "kernel_ms_per_round": round(total / rounds / 1000, 4),
                **{f"{g}_ms_per_round": round(v / rounds / 1000, 4) for g, v in us.items()},
                **{f"{g}_share": round(v / total, 4) if total else None for g, v in us.items()},
                "trace": traces[0].name}
    return out


def main() -> int:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    res = run(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps(res, indent=1))
    for name, by in sorted(res.items()):
        for key, v in by.items():
            print(f"{name} {key}: {v['kernel_ms_per_round']} ms kernels/round, GDN verify {v['gdn_verify_share']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
