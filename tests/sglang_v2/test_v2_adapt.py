"""Online schedule adaptation (spec-v2/adapt.py) on CPU: the round's GPU counters against a brute-force count on
random trees and walks, the rare read that only happens once the copy's event reports done, and the decisions
(a budget kept only while its tokens pay the cost ratio over the chain; re-probing)."""
from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch
from v2_helpers import REPO

sys.path.insert(0, str(REPO / "tests" / "runtime"))
from rt_env import RUN_SEED, load_runtime  # noqa: E402

RT = load_runtime()


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


S = _load(REPO / "patches/ddtree/runtime/schedule.py", "ddtree_schedule_for_adapt")
A = _load(REPO / "patches/ddtree/spec-v2/adapt.py", "ddtree_v2_adapt")
A._schedule_mod = lambda: S


def _round(g, bs, block, budget, vocab=12):
    """A random tree (the runtime's best-first build), targets that often follow a child, and the walk."""
    depth = block - 1
    lp = torch.log_softmax(torch.randn(bs, depth, vocab, generator=g) * 2, -1)
    lp, tok = lp.sort(-1, descending=True)
    k = min(budget, vocab)
    tree = RT.build_tree(lp[..., :k].contiguous(), tok[..., :k].contiguous(), torch.randint(0, vocab, (bs,),
                         generator=g), budget, impl="torch")
    n1 = budget + 1
    target = torch.randint(0, vocab, (bs, n1), generator=g)
    for b in range(bs):  # half the nodes: the target's token is one of the node's children
        for j in range(n1):
            kids = [i for i in range(n1) if int(tree.parent[b, i]) == j]
            if kids and torch.rand((), generator=g) < 0.7:
                target[b, j] = tree.token[b, kids[int(torch.randint(0, len(kids), (), generator=g))]]
    walk = RT.accept_walk(tree, target, impl="torch")
    return tree, target, walk


def _brute(tree, target, walk, depth):
    obs = [[0] * A.RANKS for _ in range(depth)]
    hits = [[0] * A.RANKS for _ in range(depth)]
    bs, n1 = tree.parent.shape
    for b in range(bs):
        path = {int(x) for x in walk.accepted_nodes[b] if int(x) >= 0}
        for j in range(1, int(tree.num_nodes[b])):
            p = int(tree.parent[b, j])
            if p < 0 or p not in path:
                continue
            rank = sum(1 for i in range(1, j) if int(tree.parent[b, i]) == p)
            if rank >= A.RANKS:
                continue
            d = int(tree.depth[b, j]) - 1
            obs[d][rank] += 1
            hits[d][rank] += int(tree.token[b, j]) == int(target[b, p])
    return obs, hits


@pytest.mark.parametrize("case", range(6))
def test_round_counters_equal_a_brute_force_count(case):
    g = torch.Generator().manual_seed(RUN_SEED + case)
    block, budget, bs = random.Random(case).choice([(4, 6, 3), (6, 20, 2), (8, 30, 4)])
    ad = A.Adaptation(schedule=S.parse_schedule(f"1:{budget}"), block_size=block, sizes=[1, 2, 4], device="cpu")
    want_obs = [[0] * A.RANKS for _ in range(block - 1)]
    want_hits = [[0] * A.RANKS for _ in range(block - 1)]
    tokens = 0
    for _ in range(3):
        tree, target, walk = _round(g, bs, block, budget)
        commit = (walk.accept_len + 1).to(torch.int32)
        ad.record(tree, target, walk.accepted_nodes, commit, budget)
        o, h = _brute(tree, target, walk, block - 1)
        want_obs = [[a + b for a, b in zip(x, y, strict=True)] for x, y in zip(want_obs, o, strict=True)]
        want_hits = [[a + b for a, b in zip(x, y, strict=True)] for x, y in zip(want_hits, h, strict=True)]
        tokens += int(commit.sum())
    assert ad.obs.view(block - 1, A.RANKS).tolist() == want_obs
    assert ad.hits.view(block - 1, A.RANKS).tolist() == want_hits
    assert int(ad.tokens[0]) == tokens and ad.requests[budget] == 3 * bs
    assert sum(map(sum, want_obs)) > 0  # the case exercised accepted parents


class SlowEvent:
    """An event whose copy lands only after a few polls (a GPU still busy)."""

    made: list = []

    def __init__(self):
        self.polls = 0
        SlowEvent.made.append(self)

    def record(self):
        pass

    def query(self):
        self.polls += 1
        return self.polls > 3


def test_read_only_after_the_event_and_every_period():
    SlowEvent.made.clear()
    ad = A.Adaptation(schedule=S.parse_schedule("1:8,4:0"), block_size=4, sizes=[1, 2, 4], device="cpu",
                      period=5, event_factory=SlowEvent)
    for _ in range(4):
        ad.tick()
    assert not SlowEvent.made and ad.reads == 0  # no snapshot before a period
    ad.tick()  # round 5: copy + event
    assert len(SlowEvent.made) == 1 and ad.reads == 0
    for _ in range(3):
        ad.tick()
    assert ad.reads == 0, "read before the event reported done"
    ad.tick()  # 4th poll: done
    assert ad.reads == 1 and SlowEvent.made[0].polls == 4
    for _ in range(20):  # rounds 10-29: snapshots at 10, 15, 20, 25, each read 4 polls later
        ad.tick()
    assert ad.reads == 5 and len(SlowEvent.made) == 5


def _grid(budget, bs_costs):
    return {**{(0, bs): c[0] for bs, c in bs_costs.items()}, **{(budget, bs): c[1] for bs, c in bs_costs.items()}}


def test_decide_keeps_a_tree_only_while_it_pays():
    profile = [[0.6, 0.2]] * 3
    chain = S.chain_tokens_per_round(profile, 4)  # 1 + .6 + .36 + .216
    start = {1: 8, 8: 8, 32: 0}
    grid = _grid(8, {1: (10.0, 11.0), 8: (10.0, 15.0), 32: (10.0, 30.0)})
    # measured tokens per round of b8: enough for bs 1's 1.1 x 1.02 ratio, not for bs 8's 1.5 x 1.02
    got = chain * 1.3
    out = A.decide(start, profile=profile, tokens={8: got * 100}, requests={8: 100}, round_ms=grid, block_size=4)
    assert out == {1: 8, 8: 0, 32: 0}
    # too few measured request-rounds: the cost model's tokens for b8 decide
    model = S.expected_tokens_per_round(8, profile)
    out = A.decide(start, profile=profile, tokens={8: 0.0}, requests={8: 3}, round_ms=grid, block_size=4)
    assert out == {1: 8 if model >= chain * 1.1 * 1.02 else 0, 8: 8 if model >= chain * 1.5 * 1.02 else 0, 32: 0}
    # a tree that measures worse than the chain is dropped everywhere
    out = A.decide(start, profile=profile, tokens={8: chain * 50}, requests={8: 100}, round_ms=grid, block_size=4)
    assert out == {1: 0, 8: 0, 32: 0}


def test_estimated_profile_falls_back_to_the_prior():
    prior = [[0.9, 0.05], [0.9, 0.05]]
    est = A.estimate_profile([[30, 5], [0, 0]], [[40, 40], [2, 0]], prior, min_obs=10)
    assert est[0] == pytest.approx([0.75, 0.125]) and est[1] == prior[1]


def test_adaptation_drops_a_losing_tree_and_reprobes():
    """End to end on CPU: rounds whose trees commit no more than the chain would make the size drop to the chain at
    the first read; after `reprobe` reads the start-up budgets come back for a period."""
    g = torch.Generator().manual_seed(RUN_SEED)
    ad = A.Adaptation(schedule=S.parse_schedule("1:6,8:0"), block_size=4, sizes=[1, 2, 4, 8], device="cpu",
                      period=4, reprobe=3, min_obs=1)
    assert ad.active == {1: 6, 2: 6, 4: 6, 8: 0}
    for _ in range(4 * 3 + 1):
        tree, _, _ = _round(g, 2, 4, 6)
        target = torch.full_like(tree.token, -5)  # the target never takes a drafted token: 1 token per round
        walk = RT.accept_walk(tree, target, impl="torch")
        ad.record(tree, target, walk.accepted_nodes, (walk.accept_len + 1).to(torch.int32), 6)
        ad.tick()
        if ad.reads == 1:
            assert ad.active == {1: 0, 2: 0, 4: 0, 8: 0}
    assert ad.reads == 3 and ad.probing and ad.active == ad.start
