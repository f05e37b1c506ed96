"""A Qwen3-8B-shaped target + z-lab b16 DFlash drafter pair whose acceptance is controlled (the `prof` models).

Usage: python -m bench.e2e.models.mk_profile OUTDIR BASEDIR   (BASEDIR = output of mk_models: tokenizer)

Why: random weights accept nothing, so they price a round but cannot say whether DDTree pays. These models keep the
full compute of the production shapes and make acceptance a stated number:
- Served with `--load-format dummy` (no 16 GB of checkpoint files to write or carry); the benchmark-only start-up
  hook `bench/e2e/profile_weights/sitecustomize.py` then overwrites a few tensors after SGLang's dummy init:
  every layer's `o_proj` and `down_proj` are zero (the GEMMs still run at full size, they just add nothing), every
  norm weight is one, and every row of the token embedding is the same vector u = e0. The residual stream is u at
  every position of every request, in the target and in the drafter (which shares the target's embedding and
  LM head), so both predict the same law at every position: the target's next-token law is a known, context-free
  categorical P over four tokens (A, B, C, D), and the drafter's per-depth candidates rank A > B > C > D at every
  depth.
- Sampled at temperature 1, the target token at each verified position is an independent draw from P. A chain
  (top-1 at every depth) accepts a depth with probability P(A); a tree accepts it when the draw is any of the
  node's children. So the drafter's rank-r candidate holds the true token with probability P(rank r) at every depth:
  the stated profile. With P = (0.83, 0.12, 0.04, 0.01) the chain commits 5.6 tokens per round on average
  (4.6 accepted drafts + the bonus token), inside the 5-7 published for b16 DFlash drafters on real text.

Writes OUTDIR/prof-target and OUTDIR/prof-dflash (configs of the q8b shapes) and OUTDIR/prof-target/profile.json:
the tokens, the logits the bf16 LM head will produce (realised after rounding), the realised P, and the expected
accepted drafts per round for the chain and for DDTree budgets (best-first tree over P, depth <= 15). And the same at
the Qwen3.6-27B shape: OUTDIR/prof36-target / prof36-dflash (the q36 configs) with prof36-target/profile.json (hidden
5120, vocab 248320). There the residual stream stays u = e0 through the hybrid's layers too: the GatedDeltaNet
layers' `out_proj` is zero like `o_proj` (their recurrent state is computed at full size and adds nothing), and its
Gemma-style norms scale by 1 + weight, so the hook sets their weights to zero (scale one).
"""
import heapq
import json
import math
import sys
from pathlib import Path

from bench.e2e.e2e_files import copy_tokenizer
from bench.e2e.models.mk_shapes import DRAFT_8B, DRAFT_36, QWEN3_8B, QWEN36_27B

#: the model pairs with a controlled profile: (target folder, drafter folder, target config, drafter config)
PAIRS = (("prof-target", "prof-dflash", QWEN3_8B, DRAFT_8B), ("prof36-target", "prof36-dflash", QWEN36_27B, DRAFT_36))


def text_config(cfg: dict) -> dict:
    """The language model's config (a multimodal wrapper keeps it as text_config)."""
    return cfg.get("text_config", cfg)

#: The stated law: token ids and probabilities (rank order = drafter's rank order).
TOKENS = (1000, 1001, 1002, 1003)
PROBS = (0.83, 0.12, 0.04, 0.01)
#: Every other token's logit (the A token's is 0): its total mass is vocab * e^-24, about 6e-6.
OTHER_LOGIT = -24.0
DEPTH = 15  # block 16


def bf16(x: float) -> float:
    """x rounded to bfloat16 (round to nearest even), in plain Python so the maker needs no torch."""
    import struct
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", b))[0]


def realised_logits(hidden: int, eps: float) -> tuple[list[float], float, float]:
    """LM-head column-0 weights (bf16) and the norm's output h0: the final RMSNorm maps u = e0 to h0 e0 with
    h0 = bf16(1 / sqrt(1 / hidden + eps)) (fp32 math, bf16 output), and a logit is bf16(w * h0)."""
    h0 = bf16(1.0 / math.sqrt(1.0 / hidden + eps))
    want = [math.log(p / PROBS[0]) for p in PROBS]
    w = [bf16(x / h0) for x in want]
    w_other = bf16(OTHER_LOGIT / h0)
    return w, w_other, h0


def expected_accepted(p: list[float], budget: int, depth: int = DEPTH) -> float:
    """Expected accepted drafts per round of the best-first tree of `budget` nodes when every depth's target token
    is an independent draw from p: the sum over tree nodes of their path probabilities."""
    heap = [(-q, 1) for q in p]
    heapq.heapify(heap)
    total, n = 0.0, 0
    while heap and n < budget:
        neg, d = heapq.heappop(heap)
        total, n = total - neg, n + 1
        if d < depth:
            for q in p:
                heapq.heappush(heap, (neg * q, d + 1))
    return total


def profile_for(target: dict) -> dict:
    """The profile of a target shape: LM-head weights realising P after the final norm, and what it predicts."""
    text = text_config(target)
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    w, w_other, h0 = realised_logits(hidden, text["rms_norm_eps"])
    logits = [bf16(x * h0) for x in w]
    other = bf16(w_other * h0)
    z = sum(math.exp(x) for x in logits) + (vocab - len(TOKENS)) * math.exp(other)
    p = [math.exp(x) / z for x in logits]
    chain = sum(p[0] ** d for d in range(1, DEPTH + 1))
    return {"tokens": list(TOKENS), "stated_probs": list(PROBS), "lm_head_col0": w, "lm_head_col0_other": w_other,
            "logits": logits, "other_logit": other, "probs": p, "other_mass": 1 - sum(p), "temperature": 1.0,
            "depth": DEPTH, "hidden_size": hidden, "vocab_size": vocab,
            "expected_accepted": {"chain": chain, **{f"ddtree-b{b}": expected_accepted(p, b)
                                                     for b in (8, 16, 32, 64, 128, 256)}}}


def main() -> int:
    out, basedir = Path(sys.argv[1]), Path(sys.argv[2])
    for tgt, drf, tcfg, dcfg in PAIRS:
        profile = profile_for(tcfg)
        for name, cfg in ((tgt, tcfg), (drf, dcfg)):
            d = out / name
            d.mkdir(parents=True, exist_ok=True)
            copy_tokenizer(basedir, d)
            (d / "config.json").write_text(json.dumps(cfg, indent=1))
        (out / tgt / "profile.json").write_text(json.dumps(profile, indent=1))
        print("ok", out / tgt, out / drf, "P", [round(x, 4) for x in profile["probs"]],
              "expected accepted", {k: round(v, 2) for k, v in profile["expected_accepted"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
