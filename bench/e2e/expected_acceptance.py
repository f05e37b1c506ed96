"""Expected DDTree / chain acceptance on the agree models, computed from the runtime alone (no SGLang).

Usage: python -m bench.e2e.expected_acceptance RUNTIME_PARENT_DIR OUT_JSON [MAX_NEW]
RUNTIME_PARENT_DIR holds sglang/srt/speculative/ddtree (an overlay, e.g. .e2e/overlay). The agree drafter gives the
same log-probs at every depth (C1 -0.50, C2 -1.44, C3 -2.37, C0 -3.30, the rest -9.8; block size 8, so 7 depths) and
the agree target walks the cycle C0->C1->C2->C3 deterministically. This replays greedy decoding round by round
(root = previous bonus) with the runtime's build_tree and accept_walk and reports accepted drafts per round: the
numbers the e2e run on the H200 must reproduce if the SGLang integration is right.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bench.e2e.workloads import CYCLE, NEXT
from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime

L = 7
TOK = torch.tensor([101, 102, 103, 100] + list(range(200, 260)))
LP = torch.tensor([-0.5, -1.44, -2.37, -3.3] + [-9.8] * 60)


def run(rt, budget: int | None, max_new: int) -> dict:
    """One greedy decode with the runtime ``rt``; budget None = the DFlash chain (top-1 at every depth)."""
    k = 1 if budget is None else min(budget, len(TOK))
    b = L if budget is None else budget
    lp, tok = LP[:k].expand(1, L, k).contiguous(), TOK[:k].expand(1, L, k).contiguous()
    root, produced, rounds, accepted, accepted_all = CYCLE[0], 1, 0, 0, 0  # prefill emits C0 after any prompt
    while produced < max_new:
        tree = rt.build_tree(lp, tok, torch.tensor([root]), b, impl="torch")
        target = torch.tensor([[NEXT.get(int(t), CYCLE[0]) for t in tree.token[0]]])
        w = rt.accept_walk(tree, target, impl="torch")
        n = min(int(w.accept_len[0]) + 1, max_new - produced)
        rounds += 1
        accepted += n - 1
        accepted_all += int(w.accept_len[0])
        produced += n
        root = int(w.accepted_tokens[0, n - 1])
    # 0.5.11 counts the accepted drafts a request keeps; 0.5.14+ counts every draft its last round accepted, also
    # past max_new_tokens (the scheduler commits the whole run, then truncates the output).
    return {"rounds": rounds, "accepted": accepted, "accepted_per_round": round(accepted / rounds, 4),
            "accepted_all": accepted_all, "accepted_all_per_round": round(accepted_all / rounds, 4)}


def main() -> int:
    max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    # the overlay's vendored runtime (sglang/srt/speculative/ddtree under RUNTIME_PARENT_DIR), loaded by path
    rt = load_runtime(Path(sys.argv[1]) / "sglang" / "srt" / "speculative" / "ddtree")
    out = {"chain": run(rt, None, max_new)}
    for b in (1, 4, 15, 32, 64):
        out[f"ddtree-b{b}"] = run(rt, b, max_new)
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
    for n, r in out.items():
        print(n, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
