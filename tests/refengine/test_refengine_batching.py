"""The reference engine's scheduler: requests that arrive together decode together, each step at the budget the
schedule gives for the batch size (0 = the chain round), output unchanged (greedy = autoregressive); per-depth,
per-rank acceptance counted as the runtime's cost model reads it; a schedule needs a runtime with schedule.py."""
from __future__ import annotations

import importlib
import threading
import types

import pytest
from ddtree_refengine.__main__ import resolve_schedule
from ddtree_refengine.decode import AcceptStats, Engine, SamplingParams
from ddtree_refengine.models import ModelConfig, build_target
from ddtree_refengine.server import Batcher
from ddtree_refengine.tokenizer import encode

PROMPTS = ["Hello world", "The quick brown fox", "0123456789", "ddtree"]


@pytest.fixture(scope="module")
def target():
    return build_target(ModelConfig())


def _serve(batcher: Batcher, prompts: list[str], max_new: int = 24) -> list:
    results = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = batcher.submit(encode(prompts[i]), SamplingParams(max_new, 0.0), seed=i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_schedule_picks_the_budget_per_batch_size_and_output_is_unchanged(target, runtime):
    ar = Engine(target, "NONE")
    want = [ar.generate(encode(p), SamplingParams(24, 0.0)).output_ids for p in PROMPTS]
    schedule = importlib.import_module(runtime.__name__ + ".schedule").parse_schedule("1:32,2:8,4:0")
    seen: list[tuple[int, int]] = []

    def budget_for(bs: int) -> int:
        seen.append((bs, schedule.budget_for(bs)))
        return schedule.budget_for(bs)

    engine = Engine(target, "DDTREE", runtime, budget=32, block_size=8, max_budget=32)
    got = _serve(Batcher(engine, budget_for, max_running=4), PROMPTS)
    assert [r.output_ids for r in got] == want
    assert all(b == schedule.budget_for(bs) for bs, b in seen)
    assert max(bs for bs, _ in seen) >= 2  # requests did decode together
    assert all(r.verify_rounds >= 1 for r in got)


def test_max_running_requests_bounds_the_batch(target, runtime):
    sizes: list[int] = []
    engine = Engine(target, "DDTREE", runtime, budget=8, block_size=4)
    _serve(Batcher(engine, lambda bs: sizes.append(bs) or 8, max_running=2), PROMPTS, max_new=8)
    assert sizes and max(sizes) <= 2


def test_emulated_cost_grows_with_batch_and_width(target, runtime):
    """step_cost_ms once per step, verify_token_cost_us per verified token of the batch: a wider tree costs more."""
    import time

    def wall(budget: int) -> float:
        engine = Engine(target, "DDTREE", runtime, budget=budget, block_size=4)
        t0 = time.perf_counter()
        res = _serve(Batcher(engine, lambda bs: budget, verify_token_cost_us=4000.0), PROMPTS[:1], max_new=8)
        return (time.perf_counter() - t0) / res[0].verify_rounds

    assert wall(32) - wall(2) > 0.6 * (33 - 4) * 4e-3  # 29 more verified tokens x 4 ms each, per round


def test_accept_stats_count_the_target_token_rank_per_depth(target, runtime):
    engine = Engine(target, "DFLASH", runtime, block_size=6)
    res = engine.generate(encode("Hello world"), SamplingParams(32, 0.0))
    st = engine.stats.to_dict()
    assert len(st["depth_reached"]) == 5 and len(st["rank_hits"][0]) == 8
    assert st["depth_reached"][0] == res.verify_rounds  # every round reaches draft position 0
    assert all(a >= b for a, b in zip(st["depth_reached"], st["depth_reached"][1:], strict=False))  # a path reaches d only via d-1
    for reached, hits in zip(st["depth_reached"], st["rank_hits"], strict=True):
        assert sum(hits) <= reached
    # the chain's accepted drafts are rank-0 hits and its bonus token never is (else it would have been accepted):
    # rank-0 hits = accepted drafts (the last round's may be cut by max_new_tokens, so >=)
    assert sum(h[0] for h in st["rank_hits"]) >= sum(res.round_commits) - res.verify_rounds > 0


def test_accept_stats_rank_ties_go_by_token_id():
    import torch

    st = AcceptStats(depths=1, ranks=3)
    st.record(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), [2])  # token 2 ties token 1 at the top: rank 1
    st.record(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), [3])  # rank 3: not counted among 3 ranks
    assert st.to_dict() == {"ranks": 3, "depth_reached": [2], "rank_hits": [[0, 1, 0]]}


def test_schedule_flag_needs_a_runtime_with_schedule_py(runtime):
    budget_for, top, text = resolve_schedule("1:64,8:16,32:0", runtime)
    assert (budget_for(1), budget_for(9), budget_for(40), top, text) == (64, 16, 0, 64, "1:64,8:16,32:0")
    assert resolve_schedule("24", types.SimpleNamespace(__name__="nothing", __file__="/x"))[2] == "24"
    old = types.ModuleType("ddtree_runtime_without_schedule")
    old.__file__ = "/old/runtime/__init__.py"
    with pytest.raises(RuntimeError, match="has no schedule.py"):
        resolve_schedule("1:64,8:16", old)


# -- the schedule's hysteresis (--speculative-ddtree-schedule-hold), stepped as SGLang's scheduler steps ----------

def _stepped(runtime, target, hold: int, text: str = "1:8,2:2"):
    """A batcher driven step by step (no thread) at schedule ``text``, recording each decode round's batch size."""
    schedule = importlib.import_module(runtime.__name__ + ".schedule").parse_schedule(text)
    sizes: list[int] = []

    def budget_for(bs: int) -> int:
        sizes.append(bs)
        return schedule.budget_for(bs)

    engine = Engine(target, "DDTREE", runtime, budget=8, block_size=4, max_budget=8)
    return Batcher(engine, budget_for, max_running=8, hold=hold, start=False), sizes, schedule


def _arrive(batcher: Batcher, i: int, max_new: int = 400):
    return batcher.enqueue(encode(PROMPTS[i % len(PROMPTS)]), SamplingParams(max_new, 0.0), seed=i)


def _budgets(job) -> list[int]:
    return [e[0] for e in job.req.result.round_entries]


@pytest.mark.parametrize("hold, want", [(3, [8, 8, 8, 8, 8, 2, 2]), (0, [8, 8, 8, 2, 2, 2, 2])])
def test_prefill_steps_neither_count_nor_reset_the_hold(target, runtime, hold, want):
    """A request decodes alone at b8 (batch 1); then a request arrives before every decode round, so the steps
    alternate prefill / decode while the decode batch grows to sizes that want b2. The width changes at the hold-th
    decode round that wants b2 (hold 3: the 3rd; no hold: the 1st): the prefill steps in between did not count
    toward it and did not reset the count, and the width then stays through further prefills."""
    b, sizes, _ = _stepped(runtime, target, hold)
    first = _arrive(b, 0)
    assert [b.step() for _ in range(4)] == ["prefill", "decode", "decode", "decode"]
    kinds = []
    for i in range(1, 5):
        _arrive(b, i)
        kinds += [b.step(), b.step()]
    assert kinds == ["prefill", "decode"] * 4
    assert sizes == [1, 1, 1, 2, 3, 4, 5]  # the decode batch's size only: a prefill step is no round
    assert _budgets(first) == want
    assert (b.steps, b.prefill_steps) == (7, 5)
    if hold:
        assert (b.hysteresis.switches, b.hysteresis.held) == (1, 2)


@pytest.mark.parametrize("hold", [0, 2, 3])
def test_a_batch_oscillating_at_a_threshold_changes_width_at_most_once_per_hold(target, runtime, hold):
    """Short requests (one decode round each) keep arriving beside a long one, so the decode batch goes 2, 2, 1, 2,
    2, 1, ... across the schedule's threshold at 2 (b2 from 2, b8 at 1). Without a hold the width follows every
    change; with hold N two changes are at least N rounds apart, and a hold longer than the stretches (3 > two
    rounds in a row) keeps the width the whole time."""
    b, sizes, schedule = _stepped(runtime, target, hold)
    first = _arrive(b, 0)
    assert [b.step(), b.step()] == ["prefill", "decode"]
    for i in range(1, 19, 2):
        for j in (i, i + 1):  # a short request (its one round at batch 2), then the long one alone
            _arrive(b, j, max_new=2)
            assert [b.step(), b.step()] == ["prefill", "decode"]
        assert b.step() == "decode"
    wanted = [schedule.budget_for(bs) for bs in sizes]
    assert sizes == [1] + [2, 2, 1] * 9 and len(_budgets(first)) == len(wanted)
    used = _budgets(first)
    changes = [i for i in range(1, len(used)) if used[i] != used[i - 1]]
    if hold == 0:
        assert used == wanted and len(changes) == 18
    else:
        assert all(b2 - a >= hold for a, b2 in zip(changes, changes[1:], strict=False)), used
        assert len(changes) <= len(used) // hold
    if hold == 3:
        assert used == [8] * len(used) and b.hysteresis.switches == 0
    if hold == 2:  # b2 after the first two rounds at 2, and it stays: the lone round at 1 never lasts 2 rounds
        assert used == [8, 8, 2] + [2] * (len(used) - 3)


@pytest.mark.parametrize("value, words", [("-1", "must be >= 0 decode rounds"), ("x", "got 'x'"),
                                          ("1.5", "got '1.5'")])
def test_bad_hold_is_a_start_up_error_naming_the_flag(value, words, capsys):
    from ddtree_refengine.__main__ import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--speculative-algorithm", "DFLASH", "--speculative-ddtree-budget", "1:8,2:2",
                    "--speculative-ddtree-schedule-hold", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --speculative-ddtree-schedule-hold" in err and words in err, err


def test_hold_default_and_a_runtime_without_the_hysteresis(target, runtime):
    from ddtree_refengine.__main__ import parse_args, resolve_hold

    args = parse_args(["--speculative-algorithm", "DFLASH", "--speculative-ddtree-budget", "1:8,2:2"])
    assert args.hold is None and resolve_hold(args.hold, runtime) == 8  # the runtime's DEFAULT_HOLD, as SGLang's
    assert resolve_hold(0, runtime) == 0
    old = types.ModuleType("ddtree_runtime_without_schedule")
    assert resolve_hold(None, old) == 0  # an older runtime has no hysteresis to run
    engine = Engine(target, "DDTREE", runtime, budget=8, block_size=4)
    engine.runtime = old
    with pytest.raises(RuntimeError, match="--speculative-ddtree-schedule-hold 4: the DDTree runtime .* has no "
                                           "schedule.Hysteresis"):
        Batcher(engine, lambda bs: 8, hold=4, start=False)
