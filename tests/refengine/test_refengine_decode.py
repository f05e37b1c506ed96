"""Speculative decoding must not change the output: DDTree and chain greedy == autoregressive greedy.

The comparisons are exact (token for token) because the models run in float64 and the greedy
rule rounds to fp32 identically on both paths; see models.py for why this is robust by design.
"""

from __future__ import annotations

import pytest
from ddtree_refengine.decode import Engine, SamplingParams
from ddtree_refengine.models import ModelConfig, build_target
from ddtree_refengine.tokenizer import encode

PROMPTS = ["Hello world", "def f(x):\n    return", "The quick brown fox", "0123456789", "", "ddtree"]
MAX_NEW = 32


@pytest.fixture(scope="module")
def target():
    return build_target(ModelConfig())


@pytest.fixture(scope="module")
def ar_outputs(target):
    ar = Engine(target, "NONE")
    return {p: ar.generate(encode(p), SamplingParams(MAX_NEW, 0.0)).output_ids for p in PROMPTS}


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
@pytest.mark.parametrize("budget", [1, 2, 4, 15, 32, 64])
def test_ddtree_greedy_equals_autoregressive(target, runtime, ar_outputs, budget, block_size):
    engine = Engine(target, "DDTREE", runtime, budget=budget, block_size=block_size)
    prompts = PROMPTS[(budget + block_size) % 2 :: 2]  # half the prompts per case; the cases cover all of them
    for prompt in prompts:
        res = engine.generate(encode(prompt), SamplingParams(MAX_NEW, 0.0))
        assert res.output_ids == ar_outputs[prompt], prompt
        assert res.finish_reason == {"type": "length", "length": MAX_NEW}
        assert res.verify_rounds >= 1 and 1 <= max(res.round_commits) <= block_size


@pytest.mark.parametrize("block_size", [2, 8, 16])
def test_chain_greedy_equals_autoregressive(target, runtime, ar_outputs, block_size):
    engine = Engine(target, "DFLASH", runtime, block_size=block_size)
    for prompt in PROMPTS:
        assert engine.generate(encode(prompt), SamplingParams(MAX_NEW, 0.0)).output_ids == ar_outputs[prompt]


@pytest.mark.parametrize("algorithm,budget", [("DDTREE", 16), ("DFLASH", 1)])
def test_stop_token_truncates_inside_a_round(target, runtime, ar_outputs, algorithm, budget):
    """A stop token taken from the AR output: both paths end at its first occurrence, stop token included."""
    ar = Engine(target, "NONE")
    engine = Engine(target, algorithm, runtime, budget=budget, block_size=8)
    checked = 0
    for prompt in PROMPTS:
        full = ar_outputs[prompt]
        stop = full[len(full) // 2]
        cut = full.index(stop) + 1
        params = SamplingParams(MAX_NEW, 0.0, stop_token_ids=(stop,))
        expected = ar.generate(encode(prompt), params)
        got = engine.generate(encode(prompt), params)
        assert expected.output_ids == full[:cut]
        assert got.output_ids == expected.output_ids
        assert got.finish_reason == {"type": "stop", "matched": stop}
        checked += cut < MAX_NEW
    assert checked >= 3  # the stop really cut generations short


def _mean_accept(engine: Engine, temperature: float, n_new: int = 40) -> float:
    rounds = commits = 0
    for i, prompt in enumerate(PROMPTS):
        res = engine.generate(encode(prompt), SamplingParams(n_new, temperature), seed=i)
        rounds += res.verify_rounds
        commits += sum(res.round_commits)
    return commits / rounds


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_acceptance_above_one_and_tree_beats_chain(target, runtime, temperature):
    chain = _mean_accept(Engine(target, "DFLASH", runtime, block_size=8), temperature)
    small = _mean_accept(Engine(target, "DDTREE", runtime, budget=4, block_size=8), temperature)
    big = _mean_accept(Engine(target, "DDTREE", runtime, budget=64, block_size=8), temperature)
    assert chain > 1.3, chain
    assert big > small, (small, big)
    assert big >= chain, (chain, big)


def test_budget_one_tree_is_a_one_node_chain(target, runtime):
    """Budget 1 accepts at most one draft token per round, so at most 2 tokens commit."""
    res = Engine(target, "DDTREE", runtime, budget=1, block_size=8).generate(encode("x"), SamplingParams(30, 0.0))
    assert set(res.round_commits[:-1]) <= {1, 2} and 2 in res.round_commits


def test_rejects_bad_requests(target):
    engine = Engine(target, "NONE")
    with pytest.raises(ValueError):
        engine.generate([], SamplingParams(4))
    with pytest.raises(ValueError):
        engine.generate([1, 10_000], SamplingParams(4))
    with pytest.raises(ValueError):
        Engine(target, "DDTREE", runtime=None)


def test_budget_beyond_vocab_leaves_unused_slots_and_still_matches(target, runtime, ar_outputs):
    """Block size 2 (L=1) with budget 300 > vocab 260: the tree has unused slots; verify must ignore them."""
    engine = Engine(target, "DDTREE", runtime, budget=300, block_size=2)
    prompt = PROMPTS[0]
    res = engine.generate(encode(prompt), SamplingParams(MAX_NEW, 0.0))
    assert res.output_ids == ar_outputs[prompt]
    assert res.accept_length > 1.5  # with the whole vocab at depth 1, nearly every round accepts its one draft
