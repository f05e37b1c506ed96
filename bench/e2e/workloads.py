"""What the e2e runs feed the engines and what the answers must follow: the prompts and the agree target's law.

Shared by the driver (which sends the prompts), the dry engine (which answers as a lossless engine would), the
chi-square fit (which rebuilds the prompts from their seeds and tests the sampled tokens against the law) and the
model makers. It imports nothing else of bench/e2e, so none of those imports another for these.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

#: The agree target's greedy cycle (bench/e2e/models/mk_agree.py): any token -> C0 -> C1 -> C2 -> C3 -> C0 ...
CYCLE = [100, 101, 102, 103]
NEXT = {CYCLE[i]: CYCLE[(i + 1) % 4] for i in range(4)}


def prompts(n: int, seed: int = 1234) -> list[list[int]]:
    """``n`` random prompts of 4-39 token ids in [4, 400), the same for every run with the same seed."""
    rng = random.Random(seed)
    return [[rng.randrange(4, 400) for _ in range(rng.randrange(4, 40))] for _ in range(n)]


def target_law(model_dir: Path, temperature: float):
    """p[prev, next] of the first-order agree target (weights as served, bf16, computed in fp32)."""
    import torch
    from safetensors.torch import load_file

    sd = load_file(str(model_dir / "model.safetensors"))
    cfg = json.loads((model_dir / "config.json").read_text())
    E = sd["model.embed_tokens.weight"].float()
    W = sd["lm_head.weight"].float()
    eps = cfg.get("rms_norm_eps", 1e-6)
    g = sd["model.norm.weight"].float()
    h = E * torch.rsqrt(E.pow(2).mean(-1, keepdim=True) + eps) * g
    h = h.to(torch.bfloat16).float()  # the served model keeps hidden states in bf16
    logits = (h @ W.T).to(torch.bfloat16).float()
    return torch.softmax(logits / temperature, dim=-1)
