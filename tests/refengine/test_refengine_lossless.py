"""At T > 0 DDTree must sample exactly the autoregressive distribution (one target draw per node).

We compare the empirical distribution of the first three generated tokens against the exact
joint probability computed from the target's own logits (a chi-square goodness-of-fit test).
Tokens 2 and 3 come from the tree round (the root's draw and, if accepted, a child's draw), so
a wrong mask, position, temperature or node-to-draw mapping shifts these frequencies. Seeds are
fixed, so the test is deterministic; the threshold is generous (p > 1e-4). A control run at a
different temperature must fail the same test, which shows the test has power at this N.
"""

from __future__ import annotations

import torch
from ddtree_refengine.decode import Engine, SamplingParams
from ddtree_refengine.models import ModelConfig, build_target
from ddtree_refengine.tokenizer import encode

PROMPT = encode("lossless?")
T = 1.0
N = 300
MIN_EXPECTED = 5.0


def _next_probs(target, context: list[int]) -> torch.Tensor:
    logits, _ = target.forward(torch.tensor(context), torch.arange(len(context)), target.new_cache(len(context)))
    return torch.softmax(logits[-1] / T, dim=-1)


def _exact_triples(target, floor: float = 1e-4) -> dict[tuple[int, int, int], float]:
    """P(t1, t2, t3) for every triple reachable through prefixes of probability >= floor."""
    out: dict[tuple[int, int, int], float] = {}
    p1 = _next_probs(target, PROMPT)
    for t1 in torch.nonzero(p1 >= floor).flatten().tolist():
        p2 = _next_probs(target, PROMPT + [t1])
        for t2 in torch.nonzero(p1[t1] * p2 >= floor).flatten().tolist():
            p3 = _next_probs(target, PROMPT + [t1, t2])
            joint = float(p1[t1] * p2[t2])
            for t3 in torch.nonzero(joint * p3 >= floor / 10).flatten().tolist():
                out[(t1, t2, t3)] = joint * float(p3[t3])
    return out


def _chi_square_p(samples: list[tuple[int, ...]], exact: dict[tuple[int, int, int], float]) -> tuple[float, int]:
    """p-value of a chi-square test with bins = triples expected >= 5 times, plus one bin for the rest."""
    bins = [t for t, p in exact.items() if p * N >= MIN_EXPECTED]
    expected = [exact[t] * N for t in bins]
    observed = [sum(1 for s in samples if s == t) for t in bins]
    expected.append(N - sum(expected))
    observed.append(N - sum(observed))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    df = len(bins)
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0))), df


def _samples(engine: Engine, temperature: float) -> list[tuple[int, ...]]:
    params = SamplingParams(max_new_tokens=3, temperature=temperature)
    return [tuple(engine.generate(PROMPT, params, seed=s).output_ids) for s in range(N)]


def test_ddtree_sampling_matches_autoregressive_distribution(runtime):
    target = build_target(ModelConfig())
    exact = _exact_triples(target)
    assert 0.95 < sum(exact.values()) <= 1.0 + 1e-9  # the enumeration covers almost all mass

    ddtree = Engine(target, "DDTREE", runtime, budget=16, block_size=4)
    samples = _samples(ddtree, T)
    p_value, df = _chi_square_p(samples, exact)
    assert df >= 5, "too few bins for a meaningful test"
    assert p_value > 1e-4, (p_value, df)

    wrong = _samples(Engine(target, "NONE"), 1.3)  # power control: a different distribution must be rejected
    assert _chi_square_p(wrong, exact)[0] < 1e-4
