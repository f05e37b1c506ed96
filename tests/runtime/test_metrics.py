"""The runtime's per-request budget and metrics definitions: ``prune_tree`` against trees built at the smaller budget
(the torch reference and the Triton kernels), ``schedule.request_budget``'s reading of a request's setting, and
``metrics.py``: the per-request summary, what a round adds, and a scrape written and read back (SGLang's labels and
other families beside DDTree's)."""
from __future__ import annotations

import importlib

import pytest
import torch
from rt_env import needs_triton
from rt_helpers import plant_targets, random_logits

TREE_FIELDS = ("token", "parent", "depth", "score", "first_child", "next_sibling")


def _inputs(rt, gen, batch, depth, vocab, budget, kind="normal"):
    logits = random_logits(gen, batch, depth, vocab, kind)
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    return lp, tok, torch.randint(0, vocab, (batch,), generator=gen)


def _check_pruned(rt, lp, tok, roots, budget, caps, impl, dev):
    big = rt.build_tree(lp.to(dev), tok.to(dev), roots.to(dev), budget, impl=impl)
    pruned = rt.prune_tree(big, torch.tensor(caps, device=dev))
    for b, cap in enumerate(caps):
        if cap == 0:
            assert pruned.parent[b].tolist() == [-1] * (budget + 1) and int(pruned.num_nodes[b]) == 1
            assert int(pruned.token[b, 0]) == int(roots[b])
            continue
        own = min(cap, budget)  # a cap above the round's keeps its whole tree
        k = min(own, lp.shape[-1])
        alone = rt.build_tree(lp[b:b + 1, :, :k].to(dev), tok[b:b + 1, :, :k].to(dev), roots[b:b + 1].to(dev), own,
                              impl=impl)
        n1 = own + 1
        for f in TREE_FIELDS:
            assert torch.equal(getattr(pruned, f)[b, :n1], getattr(alone, f)[0, :n1]), (b, cap, f)
        assert int(pruned.num_nodes[b]) == int(alone.num_nodes[0])
        assert (pruned.parent[b, n1:] == -1).all() and (pruned.first_child[b, n1:] == -1).all()
        assert torch.isinf(pruned.score[b, n1:]).all()
    return pruned


@pytest.mark.parametrize("case", [(4, 5, 40, 16, "normal"), (3, 4, 12, 10, "ties"), (4, 6, 30, 12, "peaked")])
def test_pruned_tree_is_the_tree_of_the_smaller_budget_and_walks_as_it(rt, gen, case):
    batch, depth, vocab, budget, kind = case
    lp, tok, roots = _inputs(rt, gen, batch, depth, vocab, budget, kind)
    caps = [budget, 0, 3, budget + 5][:batch]
    pruned = _check_pruned(rt, lp, tok, roots, budget, caps, "torch", "cpu")
    for p_follow in (0.7, 1.0):
        target = plant_targets(rt.build_tree(lp, tok, roots, budget, impl="torch"), gen, vocab, p_follow)
        walk = rt.accept_walk(pruned, target, impl="torch")
        for b, cap in enumerate(caps):
            if cap == 0:
                assert int(walk.accept_len[b]) == 0 and int(walk.bonus_token[b]) == int(target[b, 0])
                continue
            own = min(cap, budget)
            n1, k = own + 1, min(own, vocab)
            alone = rt.build_tree(lp[b:b + 1, :, :k], tok[b:b + 1, :, :k], roots[b:b + 1], own, impl="torch")
            solo = rt.accept_walk(alone, target[b:b + 1, :n1], impl="torch")
            assert int(walk.accept_len[b]) == int(solo.accept_len[0])
            assert walk.accepted_tokens[b].tolist()[: int(solo.accept_len[0]) + 1] == \
                solo.accepted_tokens[0].tolist()[: int(solo.accept_len[0]) + 1]
            assert (walk.accepted_nodes[b][walk.accepted_nodes[b] >= 0] <= cap).all()


@needs_triton
@pytest.mark.parametrize("case", [(3, 5, 40, 16, "normal"), (2, 4, 12, 10, "ties")])
def test_pruned_kernel_tree_walks_as_the_reference(rt, gen, dev, case):
    """Trees built and walked by the Triton kernels, cut by prune_tree: the same as the references at each budget."""
    batch, depth, vocab, budget, kind = case
    lp, tok, roots = _inputs(rt, gen, batch, depth, vocab, budget, kind)
    caps = [5, 0, budget][:batch]
    pruned = _check_pruned(rt, lp, tok, roots, budget, caps, "triton", dev)
    ref = rt.prune_tree(rt.build_tree(lp, tok, roots, budget, impl="torch"), torch.tensor(caps))
    target = plant_targets(ref, gen, vocab, 0.8)
    got = rt.accept_walk(pruned, target.to(dev), impl="triton")
    want = rt.accept_walk(ref, target, impl="torch")
    for f in ("accepted_nodes", "accept_len", "accepted_tokens", "bonus_token"):
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f)), f


def test_prune_refuses_caps_of_another_batch(rt, gen):
    lp, tok, roots = _inputs(rt, gen, 2, 3, 10, 4)
    with pytest.raises(ValueError, match=r"caps must be \[B=2\]"):
        rt.prune_tree(rt.build_tree(lp, tok, roots, 4, impl="torch"), torch.tensor([1, 2, 3]))


def test_a_requests_setting(rt):
    sched = importlib.import_module(rt.__name__ + ".schedule")
    rb = sched.request_budget
    assert rb(None) is None and rb({}) is None and rb({"other": 1}) is None and rb({"ddtree": None}) is None
    assert rb({"ddtree": {"budget": 12}}) == 12 and rb({"ddtree": {"budget": 0}}) == 0
    assert rb({"ddtree": {"speculative": False}}) == 0 and rb({"ddtree": {"speculative": True}}) is None
    assert rb({"ddtree": {"speculative": True, "budget": 5}}) == 5
    assert rb({"ddtree": {"speculative": False, "budget": 0}}) == 0
    for bad, words in [({"ddtree": 8}, "custom_params.ddtree: expected an object"),
                       ({"ddtree": {"budget": True}}, "custom_params.ddtree.budget: expected an integer"),
                       ({"ddtree": {"budget": 1024}}, "from 0 (no draft tokens) to 1023, got 1024"),
                       ({"ddtree": {"budget": "8"}}, "got '8'"),
                       ({"ddtree": {"speculative": 0}}, "custom_params.ddtree.speculative: expected true or false"),
                       ({"ddtree": {"speculative": False, "budget": 4}}, "speculative false contradicts budget 4"),
                       ({"ddtree": {"width": 4}}, "unknown field(s) 'width'")]:
        with pytest.raises(sched.ScheduleError) as exc:
            rb(bad)
        assert words in str(exc.value), (bad, str(exc.value))


@pytest.fixture
def m(rt):
    return importlib.import_module(rt.__name__ + ".metrics")


def test_request_summary_follows_the_common_definitions(m):
    entries = [None, m.round_entry(16, 3, 16, False), None, None, None, m.round_entry(0, 2, 15, True), None,
               m.round_entry(4, 0, 4, False)]
    got = m.request_summary(entries, depths=5)
    assert list(got) == list(m.META_KEYS)
    assert got["ddtree_verify_ct"] == 3 and got["ddtree_accept_length"] == pytest.approx(1 + 5 / 3, abs=1e-4)
    assert (got["ddtree_accepted_tokens"], got["ddtree_draft_tokens"], got["ddtree_chain_rounds"]) == (5, 35, 1)
    assert got["ddtree_accepted_per_depth"] == [2, 2, 1, 0, 0]
    assert got["ddtree_budget"] == {"min": 0, "median": 4, "max": 16}
    assert m.request_summary([None, None]) == {} and len(m.request_summary(entries)["ddtree_accepted_per_depth"]) == 3


def test_names_are_ddtrees_own_and_in_the_style_of_the_common_ones(m):
    names = [f.name for f in m.FAMILIES]
    assert all(n.startswith("sglang:ddtree_") for n in names) and len(set(names)) == len(names)
    for common in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        assert "sglang:ddtree_" + common in names
    assert {f.sample for f in m.FAMILIES if f.kind == "counter"} == {n + "_total" for n in names if n != m.ROUND_SECONDS.name}


def test_a_scrape_is_written_and_read_back_beside_other_families(m):
    t = m.Totals()
    t.add_round(17, False, [m.round_entry(16, 4, 16, False), m.round_entry(3, 1, 3, False)])
    t.add_round(8, True, [m.round_entry(0, 7, 7, True)])
    t.observe_round(17, 0.012)
    t.observe_round(17, 0.030)
    t.set_ranks([[5, 2], [3, 1]], [[3, 1], [2, 0]])
    text = m.render(t.samples(), {"model_name": 'we"ird\\name', "tp_rank": "0"})
    # SGLang's own families and a second rank's sample of ours: read past the first, summed over the labels
    scrape = ('# HELP sglang:spec_accept_length x\n# TYPE sglang:spec_accept_length gauge\n'
              'sglang:spec_accept_length{model_name="x"} 3.5\n' + text
              + 'sglang:ddtree_spec_decode_num_drafts_total{model_name="x",tp_rank="1"} 2.0\n')
    acc = m.acceptance(scrape)
    assert acc["drafts"] == 5 and acc["draft_tokens"] == 26 and acc["accepted_tokens"] == 12
    assert acc["accepted_per_depth"] == [3, 2, 2, 2, 1, 1, 1] and acc["rounds"] == {"17": 1, "8": 1}
    assert acc["chain_rounds"] == 1
    assert acc["rank_observed"] == [[5, 2], [3, 1]] and acc["rank_accepted"] == [[3, 1], [2, 0]]
    assert m.accept_profile(acc) == [[0.6, 0.5], [0.6667, 0.0]] and m.accept_profile(acc, 1) == [[0.6, 0.5]]
    assert m.mean_round_ms(acc) == {17: 21.0}
    assert m.parse(text)["sglang:ddtree_rounds_total"][0][0]["model_name"] == 'we"ird\\name'
    before = m.acceptance(text)
    t.add_round(17, False, [m.round_entry(16, 2, 16, False)])
    added = m.difference(m.acceptance(m.render(t.samples())), before)
    assert added["drafts"] == 1 and added["accepted_per_depth"][:3] == [1, 1, 0] and added["rounds"]["17"] == 1
    assert m.accept_by_depth(added)[:2] == [1.0, 1.0]
    assert m.acceptance("# nothing of ours\nsglang:spec_accept_length 2\n") is None
