"""bench.e2e.chisq: the T > 0 goodness-of-fit test accepts tokens drawn from the agree target's law and rejects a
verify that over-accepts the drafter's favourite (the failure it exists to catch). Deterministic (seeded draws)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.e2e import chisq
from bench.e2e.workloads import prompts

ROOT = Path(__file__).resolve().parents[2]

SEEDS, TOKENS, T = list(range(500, 508)), 64, 2.5


@pytest.fixture(scope="module")
def agree_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models")
    for args in (["mk_models", str(out)], ["mk_agree", str(out), str(out)]):  # the tokenizer base, then the pair
        subprocess.run([sys.executable, "-m", f"bench.e2e.models.{args[0]}", *args[1:]], check=True,
                       capture_output=True, cwd=ROOT)
    return out / "agree-qwen3"


def _draw(law: torch.Tensor, lossy: float, seed: int) -> list[list[int]]:
    """Sample every request from the law; with prob. `lossy` emit the drafter's top-1 (C1 = 101) instead."""
    g = torch.Generator().manual_seed(seed)
    ps = sum((prompts(16, seed=s) for s in SEEDS), [])
    prev = torch.tensor([p[-1] for p in ps])
    out = torch.empty(len(ps), TOKENS, dtype=torch.long)
    for i in range(TOKENS):
        prev = torch.multinomial(law[prev], 1, generator=g).squeeze(1)
        swap = torch.rand(len(ps), generator=g) < lossy
        prev = torch.where(swap, torch.full_like(prev, 101), prev)
        out[:, i] = prev
    return out.tolist()


def _result(ids: list[list[int]]) -> dict:
    return {"workloads": {"sample-T": {"temperature": T, "prompts_seeds": SEEDS, "output_ids": ids,
                                       "meta": [{} for _ in ids]}}}


def test_fit_accepts_the_law_and_rejects_a_lossy_verify(agree_dir):
    law = chisq.target_law(agree_dir, T)
    rs = {"agree-ar": _result(_draw(law, 0.0, 1)), "agree-ddtree-b64": _result(_draw(law, 0.0, 2)),
          "agree-lossy": _result(_draw(law, 0.05, 3))}
    out = chisq.analyse(rs, agree_dir)["tests"]
    n = len(SEEDS) * 16 * TOKENS
    for name in ("agree-ar", "agree-ddtree-b64"):
        r = out[name]
        assert r["tokens"] == n
        se = (r["successor_rate_expected"] * (1 - r["successor_rate_expected"]) / n) ** 0.5
        assert abs(r["successor_rate"] - r["successor_rate_expected"]) < 4 * se
        assert r["gof_p"] > 1e-3
    assert out["agree-ddtree-b64"]["vs_ar_two_sample"]["p"] > 1e-3
    assert out["agree-lossy"]["gof_p"] < 1e-6
    assert out["agree-lossy"]["vs_ar_two_sample"]["p"] < 0.05  # the weaker test: successor rate by position only
