"""Bytes the target-verify mask costs per round: the tree block only (what DDTree writes for the triton backend,
whose extend kernel skips the context columns) against full rows (what the 0.5.11 series and FlashInfer need).

Counts the cells each form of the runtime's `write_verify_mask` actually writes into a sentinel-filled buffer (so
the numbers are measured, not assumed) at small sizes, checks them against the layout formula, and tabulates the
formula at serving sizes: batch 1/16/32, budget 16/64, context 512 / 4 K / 32 K.

    python bench/bench_mask_bytes.py --out bench/results        # writes verify-mask-bytes.json and .md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "runtime"), str(ROOT)]

from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime  # noqa: E402

RT = load_runtime(ROOT / "patches" / "ddtree" / "runtime", "ddtree_runtime_bench")
SENTINEL = 7


def written_cells(batch: int, budget: int, context: int, prefix_cols: bool) -> int:
    n1 = budget + 1
    g = torch.Generator().manual_seed(batch * 1000 + budget)
    lp, tok = RT.draft_topk(torch.randn(batch, 6, 300, generator=g), min(budget, 300), impl="torch")
    tree = RT.build_tree(lp, tok, torch.zeros(batch, dtype=torch.long), budget, impl="torch")
    prefix = torch.full((batch,), context)
    vin = RT.build_verify_inputs(tree, prefix, impl="torch")
    out = torch.full((RT.mask_numel(batch * context, batch, n1),), SENTINEL, dtype=torch.uint8)
    RT.write_verify_mask(vin.mask, prefix, out, prefix_cols=prefix_cols, max_prefix=context, impl="torch")
    return int((out != SENTINEL).sum())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    measured = []
    for batch, budget, context in [(2, 16, 300), (3, 64, 1000), (1, 64, 4096)]:
        n1 = budget + 1
        tree_only, full = written_cells(batch, budget, context, False), written_cells(batch, budget, context, True)
        assert tree_only == batch * n1 * n1 and full == batch * n1 * (context + n1), (tree_only, full)
        measured.append({"batch": batch, "budget": budget, "context": context, "tree_only_bytes": tree_only,
                         "full_rows_bytes": full})
    table = []
    for batch in (1, 16, 32):
        for budget in (16, 64):
            for context in (512, 4096, 32768):
                n1 = budget + 1
                tree_only, full = batch * n1 * n1, batch * n1 * (context + n1)
                table.append({"batch": batch, "budget": budget, "context": context, "tree_only_bytes": tree_only,
                              "full_rows_bytes": full, "ratio": round(full / tree_only, 1)})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify-mask-bytes.json").write_text(json.dumps({"measured": measured, "table": table}, indent=1))
    lines = ["# Target-verify mask bytes per round (one byte per cell)", "",
             "Command: `python bench/bench_mask_bytes.py --out bench/results`. Measured = cells the runtime's "
             "`write_verify_mask` changed in a sentinel-filled buffer (equal to the formula in every case):", "",
             "| batch | budget | context | tree block only | full rows |", "|---|---|---|---|---|"]
    lines += [f"| {m['batch']} | {m['budget']} | {m['context']} | {m['tree_only_bytes']:,} | {m['full_rows_bytes']:,} |"
              for m in measured]
    lines += ["", "At serving sizes (B x N1 x N1 against B x N1 x (context + N1)); the triton backend's CUDA-graph "
              "replay used to copy the full rows a second time, which DDTree's in-place write also avoids:", "",
              "| batch | budget | context | tree block only | full rows | ratio |", "|---|---|---|---|---|---|"]
    lines += [f"| {t['batch']} | {t['budget']} | {t['context']} | {t['tree_only_bytes'] / 1e3:.1f} kB | "
              f"{t['full_rows_bytes'] / 1e6:.2f} MB | {t['ratio']}x |" for t in table]
    (args.out / "verify-mask-bytes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
