"""The batch-size schedule and its cost model (runtime/schedule.py): parsing, budget_for, the expected-token model
against brute-force enumeration, and the fits."""
from __future__ import annotations

import importlib.util
import itertools
import random
import sys

import pytest
from rt_env import RUN_SEED, RUNTIME_DIR


def _load():
    """By path, on its own (as the product's `tune` command loads it: no torch, no package)."""
    spec = importlib.util.spec_from_file_location("ddtree_schedule_alone", RUNTIME_DIR / "schedule.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


S = _load()


@pytest.mark.parametrize("text, entries, canonical", [
    ("64", ((1, 64),), "64"),
    (" 15 ", ((1, 15),), "15"),
    ("1:64", ((1, 64),), "64"),
    ("1:64,8:32,16:16,32:0", ((1, 64), (8, 32), (16, 16), (32, 0)), "1:64,8:32,16:16,32:0"),
    ("1:0", ((1, 0),), "1:0"),
    (" 1 : 32 , 4 : 0 ", ((1, 32), (4, 0)), "1:32,4:0"),
    ("1:1023", ((1, 1023),), "1023"),
])
def test_parse_good(text, entries, canonical):
    sched = S.parse_schedule(text)
    assert sched.entries == entries
    assert str(sched) == canonical
    assert S.parse_schedule(str(sched)) == sched


@pytest.mark.parametrize("text, message", [
    ("", "empty value"),
    ("   ", "empty value"),
    ("abc", "budget 'abc' is not an integer"),
    ("0", "single budget must be >= 1"),
    ("-3", "single budget must be >= 1"),
    ("1024", "out of range"),
    ("2:64,8:0", "first threshold must be 1"),
    ("1:64,8", "entry 2 '8' is not THRESHOLD:BUDGET"),
    ("1:64,8:32:1", "entry 2 '8:32:1' is not THRESHOLD:BUDGET"),
    ("1:64,,8:0", "entry 2 '' is not THRESHOLD:BUDGET"),
    ("1:64,8:32,8:16", "thresholds must increase strictly, got 8 after 8"),
    ("1:64,16:32,8:16", "thresholds must increase strictly, got 8 after 16"),
    ("1:64,0:32", "threshold of entry 2 must be a batch size >= 1"),
    ("1:64,8:x", "budget of entry 2 'x' is not an integer"),
    ("1:64,y:8", "threshold of entry 2 'y' is not an integer"),
    ("1:-1", "budget -1 at threshold 1 is out of range"),
    ("1:2000", "budget 2000 at threshold 1 is out of range"),
    ("1.5", "budget '1.5' is not an integer"),
])
def test_parse_bad(text, message):
    with pytest.raises(S.ScheduleError) as err:
        S.parse_schedule(text, source="--speculative-ddtree-budget")
    assert str(err.value).startswith("--speculative-ddtree-budget: ")
    assert message in str(err.value)


@pytest.mark.parametrize("text, canonical", [
    ('{"1": 64, "8": 16, "32": 0}', "1:64,8:16,32:0"),
    ('{"32": 0, "1": 64, "8": 16}', "1:64,8:16,32:0"),  # key order does not matter
    ('{"4": 32, "16": 0}', "1:32,16:0"),  # the smallest key covers the sizes below it
    ('{"1": 64, "2": 64, "8": 0}', "1:64,8:0"),  # equal neighbours merge
    ('{"1": 16}', "16"),
    ('{"1": 0}', "1:0"),
])
def test_parse_sglang_json_shape(text, canonical, tmp_path):
    """SGLang's adaptive shape, keyed by batch size, inline or as a .json file: the same Schedule as T:B text."""
    sched = S.parse_schedule(text)
    assert str(sched) == canonical and S.parse_schedule(canonical) == sched
    f = tmp_path / "budgets.json"
    f.write_text(text)
    assert S.parse_schedule(str(f)) == sched


@pytest.mark.parametrize("text, message", [
    ('{"1": [1, 3, 5, 7]}', "list of draft depths (SGLang's EAGLE --speculative-adaptive form)"),
    ('{"1": 64, "8": "16"}', "batch size 8: budget '16' is not an integer"),
    ('{"1": true}', "budget True is not an integer"),
    ('{"0": 64}', "batch size '0' must be >= 1"),
    ('{"x": 64}', "batch size 'x'"),
    ('{"1": 2000}', "budget 2000 is out of range"),
    ('{"1": 64,', "not valid JSON"),
    ("{}", "expected a non-empty JSON object"),
    ("/nonexistent/b.json", "cannot read the schedule file /nonexistent/b.json"),
])
def test_parse_sglang_json_shape_bad(text, message):
    with pytest.raises(S.ScheduleError) as err:
        S.parse_schedule(text, source="--speculative-ddtree-budget")
    assert str(err.value).startswith("--speculative-ddtree-budget")
    assert message in str(err.value), str(err.value)


def test_parse_non_string():
    with pytest.raises(S.ScheduleError, match="expected a budget N or a schedule"):
        S.parse_schedule(64)


def test_budget_for():
    sched = S.parse_schedule("1:64,8:32,16:16,32:0")
    got = {bs: sched.budget_for(bs) for bs in (1, 2, 7, 8, 9, 15, 16, 31, 32, 33, 512)}
    assert got == {1: 64, 2: 64, 7: 64, 8: 32, 9: 32, 15: 32, 16: 16, 31: 16, 32: 0, 33: 0, 512: 0}
    assert sched.budgets == (0, 16, 32, 64) and sched.max_budget == 64 and not sched.is_single
    single = S.parse_schedule("15")
    assert all(single.budget_for(bs) == 15 for bs in (1, 3, 48)) and single.is_single
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        sched.budget_for(0)


def test_schedule_of_merges_and_starts_at_one():
    sched = S.Schedule.of({2: 64, 4: 64, 8: 32, 16: 32, 32: 0})
    assert sched.entries == ((1, 64), (8, 32), (32, 0))
    assert S.Schedule.of(7).entries == ((1, 7),)
    with pytest.raises(S.ScheduleError):
        S.Schedule(((2, 5),))


# -- the cost model -------------------------------------------------------------------------------------------------

def _brute_force(budget, profile):
    """Every path of up to len(profile) depths over every rank, top `budget` by product probability."""
    probs = []
    for depth in range(1, len(profile) + 1):
        for ranks in itertools.product(*(range(len(profile[d])) for d in range(depth))):
            p = 1.0
            for d, r in enumerate(ranks):
                p *= profile[d][r]
            probs.append(p)
    probs.sort(reverse=True)
    return 1.0 + sum(probs[:budget])


def _random_profile(rng, depth, ranks):
    rows = []
    for _ in range(depth):
        raw = [rng.random() for _ in range(ranks)]
        scale = rng.uniform(0.3, 1.0) / sum(raw)
        rows.append([x * scale for x in raw])  # unsorted on purpose: the model sorts each depth itself
    return rows


@pytest.mark.parametrize("case", range(12))
def test_expected_tokens_matches_brute_force(case):
    rng = random.Random(RUN_SEED * 31 + case)
    depth, ranks = rng.randint(1, 4), rng.randint(1, 3)
    profile = _random_profile(rng, depth, ranks)
    n_paths = sum(ranks ** d for d in range(1, depth + 1))
    for budget in sorted({0, 1, 2, 3, n_paths // 2, n_paths, n_paths + 5}):
        want = _brute_force(budget, profile)
        assert S.expected_tokens_per_round(budget, profile) == pytest.approx(want, rel=1e-12, abs=1e-12), \
            (case, budget, profile)


def test_expected_tokens_simple_cases():
    chain_only = [[0.5], [0.5], [0.5]]
    assert S.expected_tokens_per_round(3, chain_only) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert S.chain_tokens_per_round(chain_only) == pytest.approx(1.875)
    assert S.chain_tokens_per_round(chain_only, block_size=2) == pytest.approx(1.5)
    assert S.expected_tokens_per_round(0, chain_only) == 1.0
    # a perfect drafter: every node on its chain is accepted; siblings of probability 0 add nothing
    assert S.expected_tokens_per_round(10, [[1.0, 0.0]] * 4) == pytest.approx(5.0)


@pytest.mark.parametrize("bad, message", [
    ([[0.5, 0.6]], "sums to 1.1000 > 1"),
    ([[1.5]], "outside \\[0, 1\\]"),
    ([[-0.1]], "outside \\[0, 1\\]"),
])
def test_profile_checked(bad, message):
    with pytest.raises(S.ScheduleError, match=message):
        S.expected_tokens_per_round(4, bad)


def test_fit_schedule_picks():
    profile = [[0.8, 0.15]] * 3  # tree of 3 nodes: 1 + .8 + .64 + .512 (the chain's nodes are the best paths)
    chain = S.chain_tokens_per_round(profile)
    tree2 = S.expected_tokens_per_round(2, profile)
    tree6 = S.expected_tokens_per_round(6, profile)
    assert tree6 > tree2 > 1.0
    round_ms = {(0, 1): 10.0, (2, 1): 9.0, (6, 1): 9.5,      # bs 1: the 6-node tree is cheap -> 6
                (0, 4): 10.0, (2, 4): 6.0, (6, 4): 30.0,     # bs 4: the 2-node tree is very cheap -> 2
                (0, 8): 10.0, (2, 8): 20.0, (6, 8): 40.0}    # bs 8: the chain
    assert tree6 / 9.5 > chain / 10.0 > tree2 / 9.0
    assert tree2 / 6.0 > chain / 10.0 > tree6 / 30.0
    sched = S.fit_schedule(profile, round_ms, chain, [1, 4, 8], [2, 6])
    assert str(sched) == "1:6,4:2,8:0"
    # a tie with the chain goes to the chain
    tie = {**round_ms, (6, 1): tree6 / (chain / 10.0)}
    assert S.fit_schedule(profile, {**tie, (2, 1): 100.0}, chain, [1], [2, 6]).budget_for(1) == 0
    # the margin keeps a budget that wins by less than it out
    close = {(0, 1): 10.0, (6, 1): tree6 / (chain / 10.0) / 1.01}  # the tree wins by 1 %
    assert S.fit_schedule(profile, close, chain, [1], [6]).budget_for(1) == 6
    assert S.fit_schedule(profile, close, chain, [1], [6], margin=0.02).budget_for(1) == 0


def test_fit_schedule_needs_every_cost():
    with pytest.raises(S.ScheduleError, match=r"no chain round cost for batch size 4"):
        S.fit_schedule([[0.5]], {(0, 1): 1.0, (2, 1): 1.0}, 1.5, [1, 4], [2])
    with pytest.raises(S.ScheduleError, match=r"no round cost for budget 2 at batch size 1"):
        S.fit_schedule([[0.5]], {(0, 1): 1.0}, 1.5, [1], [2])


def test_interpolated_costs():
    table = S.DEFAULT_ROUND_MS
    assert S.interpolate_round_ms(table, 64, 8) == pytest.approx(19.37)
    assert S.interpolate_round_ms(table, 0, 4) == pytest.approx(7.95 + (10.09 - 7.95) * 3 / 7)
    assert S.interpolate_round_ms(table, 48, 1) == pytest.approx((8.52 + 9.01) / 2)
    assert S.interpolate_round_ms(table, 64, 48) == pytest.approx(71.89 + (71.89 - 19.37) * 16 / 24)
    assert S.interpolate_round_ms(table, 8, 1) == pytest.approx((7.95 + 8.27) / 2)  # between the chain and b16
    grid = S.round_ms_grid(table, [16, 64], [1, 8])
    assert set(grid) == {(b, bs) for b in (0, 16, 64) for bs in (1, 8)}


def test_default_schedule_from_the_h200_table():
    """`auto`: with the built-in cost table and profile a big tree pays at batch 1 only (the verify forward is
    compute-bound: at batch 8 b64 needs 1.9x the chain's tokens)."""
    sched = S.default_schedule([1, 2, 4, 8, 16, 24, 32])
    assert sched.budget_for(1) == 64
    assert all(sched.budget_for(bs) == 0 for bs in (2, 4, 8, 16, 24, 32))
    # a drafter whose rank-1 candidates are often right (a weak chain): trees pay at every size, smaller ones as
    # the batch grows
    bushy = [[0.6, 0.3, 0.05]] * 15
    sched = S.default_schedule([1, 2, 4, 8, 32], accept_profile=bushy)
    assert str(sched) == "1:64,4:32,8:16"
    assert S.parse_schedule(str(sched)) == sched


# -- hybrid GatedDeltaNet targets -------------------------------------------------------------------------------------

def test_max_budget_bounds_the_candidates_per_batch_size():
    """A budget whose per-node states do not fit at a batch size is no candidate there and needs no cost; a batch
    size missing from the limits takes the next larger one's (more requests never fit more nodes)."""
    prof = [[0.6, 0.3, 0.05]] * 15
    costs = {(0, 1): 10.0, (0, 4): 12.0, (0, 8): 14.0, (16, 1): 10.1, (64, 1): 10.2, (16, 4): 12.1, (16, 8): 14.1}
    chain = S.chain_tokens_per_round(prof)
    sched = S.fit_schedule(prof, costs, chain, [1, 4, 8], [16, 64], max_budget={1: 100, 8: 20})
    assert str(sched) == "1:64,4:16"  # b64 at 4 requests is bounded by the limit at 8 (20): no cost asked for it
    with pytest.raises(S.ScheduleError, match="no round cost for budget 64 at batch size 4"):
        S.fit_schedule(prof, costs, chain, [1, 4, 8], [16, 64], max_budget={1: 100, 4: 64, 8: 20})
    assert str(S.fit_schedule(prof, costs, chain, [1, 4, 8], [16, 64], max_budget={1: 0, 8: 0})) == "1:0"


def test_gdn_verify_cost_per_node_from_the_measured_shares():
    """The H200 27B-shape figures of the recurrent form: GDN verify 11 % of the chain's round (16 tokens) and 47 % of
    b128's (129 nodes) at batch 1: 0.150 ms per verified node. The table `auto` reads is the chunk form's: its rows
    are the medians of bench/results/hybrid-0.5.17-h200-q36c.md."""
    per = S.gdn_verify_ms_per_node()
    assert per == pytest.approx((0.47 * 20.89 * 1.96 - 0.11 * 20.89) / (129 - 16))
    assert 0.14 < per < 0.16
    t = S.HYBRID_ROUND_MS
    assert set(t) == {0, 16, 64} and all(set(row) == {1, 8, 16} for row in t.values())
    assert t[16][1] / t[0][1] == pytest.approx(21.736 / 20.68, abs=1e-3)
    assert t[64][16] / t[0][16] == pytest.approx(153.075 / 45.561, abs=1e-3)
    assert S._limit_at(S.HYBRID_MAX_BUDGET, 1) == 586  # fewer requests fit at least what 16 do
    rec = S.HYBRID_ROUND_MS_RECURRENT
    assert rec[128][1] / rec[0][1] == pytest.approx(1.96) and set(rec[128]) == {1}  # b128 fit one request only
    # the model for an unmeasured host: the dense table plus the GDN verify of every node and request
    dense = S.interpolate_round_ms(S.DEFAULT_ROUND_MS, 64, 8)
    assert S.hybrid_round_ms(S.DEFAULT_ROUND_MS, 64, 8, gdn_ms_per_node=per) == pytest.approx(dense + per * 65 * 8)
    assert S.hybrid_round_ms(S.DEFAULT_ROUND_MS, 0, 1, gdn_ms_per_node=per) == pytest.approx(7.95 + per * 16)


def test_auto_on_a_hybrid_target():
    """`auto` on a hybrid: the hybrid table, each budget only where it fits and was measured. Under the assumed
    profile no tree pays its round (the chain everywhere); a sharper drafter buys a tree at batch 1, and never an
    unmeasured cell."""
    assert str(S.default_schedule(range(1, 513), hybrid=True)) == "1:0"
    assert str(S.default_schedule(range(1, 513))) == "1:64,2:0"  # the dense table is unchanged
    sharp = [[0.6, 0.3, 0.05]] * 15
    sched = S.default_schedule([1, 2, 4, 8, 16, 32], accept_profile=sharp, hybrid=True)
    assert sched.budget_for(1) > 16
    for bs in (2, 4, 8, 16, 32):
        b = sched.budget_for(bs)
        assert b == 0 or (b <= S._limit_at(S.HYBRID_MAX_BUDGET, bs) and max(S.HYBRID_ROUND_MS[b]) >= bs), (bs, b)
    assert sched.budget_for(32) == 0  # no budget was measured at 32 requests


def test_tune_fit_on_a_hybrid_host_with_cells_that_did_not_fit():
    """tune's fit (ddtree_deploy/tune.py) with the cells a hybrid host could not run left out: those budgets are no
    candidates at those batch sizes; the table shows them as None."""
    from types import SimpleNamespace as M

    from ddtree_deploy import tune as tune_mod

    def m(config, batch, round_ms, tok_s, accept=None):
        return M(config=config, batch=batch, round_ms=round_ms, tok_s=tok_s, accept_length=accept)

    ms = [m("plain", 1, 5.0, 200.0), m("plain", 8, 6.0, 1300.0), m("chain", 1, 10.0, 400.0, 4.0),
          m("chain", 8, 14.0, 2200.0, 4.0), m("ddtree-16", 1, 10.2, 520.0, 5.3), m("ddtree-16", 8, 15.0, 2600.0, 5.3),
          m("ddtree-64", 1, 11.0, 560.0, 6.1)]  # b64 did not fit at 8 requests
    stats = {"depth_reached": [100, 80], "rank_hits": [[80, 10], [60, 8]]}
    res = tune_mod.fit(ms, [16, 64], [1, 8], stats, depths=2, margin=0.0)
    assert {(r["budget"], r["batch"]) for r in res["round_ms"]} == {(0, 1), (0, 8), (16, 1), (16, 8), (64, 1)}
    row8 = next(r for r in res["table"] if r["batch"] == 8)
    assert row8["b64_tok_s"] is None and row8["chosen_budget"] in (0, 16)
    assert res["measured_tokens_per_round"] == {16: 5.3, 64: 6.1}


# -- hysteresis (--speculative-ddtree-schedule-hold) ----------------------------------------------------------------

def _run(hold: int, wanted: list[int], allowed=None) -> list[int]:
    h = S.Hysteresis(hold)
    return [h.step(w, None if allowed is None else allowed[i]) for i, w in enumerate(wanted)]


def test_hysteresis_steady_change_switches_at_the_hold_th_round():
    sched = S.parse_schedule("1:64,8:16,32:0")
    sizes = [1] * 5 + [8] * 6 + [40] * 6  # the decode batch grows past two thresholds and stays
    used = _run(4, [sched.budget_for(bs) for bs in sizes])
    assert used == [64] * 5 + [64, 64, 64, 16, 16, 16] + [16, 16, 16, 0, 0, 0]
    assert _run(1, [sched.budget_for(bs) for bs in sizes]) == [sched.budget_for(bs) for bs in sizes]
    assert _run(0, [64, 16, 64, 0]) == [64, 16, 64, 0]  # 0 and 1: no hold


def test_hysteresis_boundary_oscillation_changes_width_at_most_once_per_hold():
    sched = S.parse_schedule("1:64,4:16")
    rng = random.Random(RUN_SEED * 7 + 1)
    for hold in (2, 3, 8):
        for _ in range(50):  # batch sizes around the threshold 4: 3 wants b64, 4 and 5 want b16
            sizes = [rng.choice((3, 4, 5)) if rng.random() < 0.7 else rng.choice((3, 3, 3, 4)) for _ in range(60)]
            wanted = [sched.budget_for(bs) for bs in sizes]
            h = S.Hysteresis(hold)
            used = [h.step(w) for w in wanted]
            switch_at = [i for i in range(1, len(used)) if used[i] != used[i - 1]]
            assert all(b - a >= hold for a, b in zip(switch_at, switch_at[1:], strict=False)), (hold, sizes, used)
            for i in switch_at:  # a switch only after `hold` rounds in a row wanted the new budget
                assert wanted[max(0, i - hold + 1): i + 1] == [used[i]] * min(hold, i + 1), (hold, sizes, used)
            assert h.switches == len(switch_at) and h.forced == 0
            assert h.held == sum(u != w for u, w in zip(used, wanted, strict=True))
    # a strict alternation never holds a new budget long enough: the width stays
    assert _run(3, [16, 64] * 10) == [16] * 20
    assert _run(2, [64, 16, 16, 64, 16, 16]) == [64, 64, 16, 16, 16, 16]


def test_hysteresis_picks_only_runnable_budgets():
    """With CUDA graphs a round can run only what its padded size captured: a held budget outside that gives way at
    once (a forced switch); the budget run is always one that was wanted, and one the round can run."""
    used = _run(8, [64, 64, 16, 16, 0, 0], allowed=[{64}, {64}, {16, 64}, {16}, {0, 16}, {0}])
    assert used == [64, 64, 64, 16, 16, 0]
    h = S.Hysteresis(8)
    h.step(64)
    assert h.step(16, {16}) == 16 and h.forced == 1 and h.switches == 1
    with pytest.raises(ValueError, match="wanted budget 32 is not among this round's runnable budgets"):
        h.step(32, {16})


@pytest.mark.parametrize("value, message", [
    (-1, "must be >= 0 decode rounds"), ("-2", "must be >= 0 decode rounds"), ("x", "hold 'x' is not an integer"),
    ("1.5", "hold '1.5' is not an integer"), (True, "expected a number of decode rounds"),
    (2.0, "expected a number of decode rounds"),
])
def test_hold_values_checked(value, message):
    with pytest.raises(S.ScheduleError, match=f"^--speculative-ddtree-schedule-hold: .*{message}"):
        S.check_hold(value, source="--speculative-ddtree-schedule-hold")
    assert S.check_hold("8") == 8 and S.check_hold(0) == 0 and S.DEFAULT_HOLD == 8
