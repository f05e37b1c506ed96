"""build_tree: exact equality with the paper's heap (oracle) and between the Triton kernel and the reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rt_env import needs_triton
from heap_oracle import heap_build
from rt_helpers import TREE_FIELDS, assert_same, np_f32, random_logits


def _tree_inputs(rt, gen, batch, depth, vocab, budget, kind, dev="cpu"):
    logits = random_logits(gen, batch, depth, vocab, kind)
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return lp.to(dev), tok.to(dev), roots.to(dev)


def _assert_matches_oracle(tree, lp, tok, roots, budget, tie_break="parent"):
    n1 = budget + 1
    for b in range(lp.shape[0]):
        o = heap_build(np_f32(lp[b]), tok[b].cpu().numpy(), int(roots[b]), budget, tie_break)
        n = o.num_nodes
        assert int(tree.num_nodes[b]) == n
        assert tree.token[b, :n].tolist() == o.token
        assert tree.parent[b, :n].tolist() == o.parent
        assert tree.depth[b, :n].tolist() == o.depth
        assert tree.score[b, :n].tolist() == o.score  # bit-exact fp32 accumulation
        # unused slots per the contract
        assert tree.token[b, n:].tolist() == [0] * (n1 - n)
        assert tree.parent[b, n:].tolist() == [-1] * (n1 - n)
        assert tree.depth[b, n:].tolist() == [0] * (n1 - n)
        assert torch.isneginf(tree.score[b, n:]).all()
        assert tree.first_child[b, n:].tolist() == [-1] * (n1 - n)
        assert tree.next_sibling[b, n:].tolist() == [-1] * (n1 - n)


def _assert_structure(tree, lp, tok):
    """Invariants any valid layout must satisfy, checked independently of the oracle."""
    for b in range(tree.parent.shape[0]):
        n = int(tree.num_nodes[b])
        par, dep = tree.parent[b].tolist(), tree.depth[b].tolist()
        score, token = tree.score[b].tolist(), tree.token[b].tolist()
        assert par[0] == -1 and dep[0] == 0 and score[0] == 0.0
        children: dict[int, list[int]] = {}
        for i in range(1, n):
            p = par[i]
            assert 0 <= p < i, "parent before child"
            assert dep[i] == dep[p] + 1 <= tree.max_depth
            rank = tok[b, dep[i] - 1].tolist().index(token[i])
            assert score[i] == float(np.float32(score[p]) + np.float32(lp[b, dep[i] - 1, rank]))
            assert score[i] <= score[i - 1] or i == 1, "nodes in key order: score non-increasing"
            children.setdefault(p, []).append(i)
        for p in range(n):
            kids = children.get(p, [])
            assert int(tree.first_child[b, p]) == (kids[0] if kids else -1)
            chain, c = [], int(tree.first_child[b, p])
            while c != -1:
                chain.append(c)
                c = int(tree.next_sibling[b, c])
            assert chain == kids, "sibling links ascending and complete"
            assert len({token[k] for k in kids}) == len(kids), "siblings carry distinct tokens"


CASES = [  # (batch, depth, vocab, budget, kind)
    (3, 4, 12, 10, "normal"),
    (2, 5, 9, 40, "ties"),
    (2, 3, 6, 30, "equal"),
    (2, 6, 20, 8, "peaked"),
    (1, 15, 50, 64, "normal"),
    (2, 2, 2, 10, "normal"),   # vocab < budget: only 1 + 2 + 4 nodes exist
    (2, 3, 40, 1, "normal"),   # budget 1
    (1, 7, 3, 200, "ties"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"B{c[0]}L{c[1]}V{c[2]}N{c[3]}-{c[4]}" for c in CASES])
def test_reference_equals_heap_oracle(rt, gen, case):
    batch, depth, vocab, budget, kind = case
    lp, tok, roots = _tree_inputs(rt, gen, batch, depth, vocab, budget, kind)
    tree = rt.build_tree(lp, tok, roots, budget, impl="torch")
    assert tree.max_depth == depth and tree.token.shape == (batch, budget + 1)
    _assert_matches_oracle(tree, lp, tok, roots, budget)
    _assert_structure(tree, lp, tok)


def test_reference_equals_heap_oracle_many_random(rt, gen):
    for _ in range(40):
        batch = int(torch.randint(1, 4, (), generator=gen))
        depth = int(torch.randint(1, 8, (), generator=gen))
        vocab = int(torch.randint(2, 25, (), generator=gen))
        budget = int(torch.randint(1, 90, (), generator=gen))
        kind = ["normal", "ties", "peaked"][int(torch.randint(0, 3, (), generator=gen))]
        lp, tok, roots = _tree_inputs(rt, gen, batch, depth, vocab, budget, kind)
        _assert_matches_oracle(rt.build_tree(lp, tok, roots, budget, impl="torch"), lp, tok, roots, budget)


def test_large_budget_equals_oracle(rt, gen):
    lp, tok, roots = _tree_inputs(rt, gen, 1, 15, 1500, 1024, "normal")
    tree = rt.build_tree(lp, tok, roots, 1024, impl="torch")
    _assert_matches_oracle(tree, lp, tok, roots, 1024)
    assert int(tree.num_nodes[0]) == 1025


def test_rank_path_tiebreak_agrees_on_continuous_inputs(rt, gen):
    """Without exact score ties the documented order equals the rank-path order the brief describes."""
    lp, tok, roots = _tree_inputs(rt, gen, 2, 6, 30, 48, "normal")
    _assert_matches_oracle(rt.build_tree(lp, tok, roots, 48, impl="torch"), lp, tok, roots, 48, "rank_path")


def test_equal_score_children_follow_parent_order(rt):
    """Exact tie at depth 3: [1,0,1] and [0,1,0] both score -5. The parent [1,0] (-3) precedes [0,1] (-4),
    so [1,0,1] comes first (rank-path order would put [0,1,0] first). Budget 10 keeps only one of them:
    8 nodes score >= -4, then [1,1] (-5, depth 2), then the depth-3 tie."""
    lp = torch.tensor([[[-1.0, -2.0], [-1.0, -3.0], [-1.0, -2.0]]])
    tok = torch.tensor([[[10, 11], [20, 21], [30, 31]]])
    roots = torch.tensor([7])
    tree = rt.build_tree(lp, tok, roots, 10, impl="torch")
    _assert_matches_oracle(tree, lp, tok, roots, 10, "parent")
    paths = []
    for i in range(11):
        path, c = [], i
        while c > 0:
            path.append(int(tree.token[0, c]))
            c = int(tree.parent[0, c])
        paths.append(tuple(reversed(path)))
    assert (11, 20, 31) in paths and (10, 21, 30) not in paths
    rank_path = heap_build(lp[0].numpy(), tok[0].numpy(), 7, 10, "rank_path")
    assert rank_path.token != tree.token[0].tolist()  # the two tie-breaks really differ here


def test_vocab_smaller_than_budget_counts_nodes(rt, gen):
    lp, tok, roots = _tree_inputs(rt, gen, 2, 3, 2, 30, "normal")
    tree = rt.build_tree(lp, tok, roots, 30, impl="torch")
    assert tree.num_nodes.tolist() == [1 + 2 + 4 + 8] * 2


def test_budget_beyond_depth_branches_and_peaked_reaches_max_depth(rt, gen):
    lp, tok, roots = _tree_inputs(rt, gen, 2, 4, 30, 40, "normal")
    tree = rt.build_tree(lp, tok, roots, 40, impl="torch")
    for b in range(2):
        kids = torch.bincount(tree.parent[b, 1:].long(), minlength=41)
        assert int(kids.max()) >= 2 and int(tree.depth[b].max()) <= 4
    lp, tok, roots = _tree_inputs(rt, gen, 2, 6, 30, 6, "peaked")
    tree = rt.build_tree(lp, tok, roots, 6, impl="torch")
    assert tree.depth.tolist() == [[0, 1, 2, 3, 4, 5, 6]] * 2  # a chain to depth L
    assert tree.parent.tolist() == [[-1, 0, 1, 2, 3, 4, 5]] * 2


def test_rejects_bad_arguments(rt):
    lp, tok = torch.zeros(1, 2, 3), torch.zeros(1, 2, 3, dtype=torch.long)
    with pytest.raises(ValueError):
        rt.build_tree(lp, tok, torch.zeros(1, dtype=torch.long), 0, impl="torch")
    with pytest.raises(ValueError):
        rt.build_tree(lp, tok, torch.zeros(1, dtype=torch.long), 1025, impl="torch")
    with pytest.raises(ValueError):
        rt.build_tree(lp, tok, torch.zeros(2, dtype=torch.long), 4, impl="torch")


KERNEL_CASES = [
    (3, 4, 12, 10, "normal"),
    (2, 4, 8, 24, "ties"),
    (1, 3, 5, 16, "equal"),
    (1, 5, 20, 6, "peaked"),
    (2, 2, 2, 10, "normal"),
    (2, 3, 40, 1, "normal"),
]


@needs_triton
@pytest.mark.parametrize("case", KERNEL_CASES, ids=[f"B{c[0]}L{c[1]}V{c[2]}N{c[3]}-{c[4]}" for c in KERNEL_CASES])
def test_kernel_equals_reference_and_oracle(rt, gen, dev, case):
    batch, depth, vocab, budget, kind = case
    lp, tok, roots = _tree_inputs(rt, gen, batch, depth, vocab, budget, kind, dev)
    got = rt.build_tree(lp, tok, roots, budget, impl="triton")
    ref = rt.build_tree(lp, tok, roots, budget, impl="torch")
    assert_same(got, ref, TREE_FIELDS)
    assert got.max_depth == ref.max_depth == depth
    _assert_matches_oracle(got, lp.cpu(), tok.cpu(), roots.cpu(), budget)


@needs_triton
@pytest.mark.parametrize("use_gather,merge_at_end", [(True, False), (False, False)])
def test_kernel_variants(rt, gen, dev, use_gather, merge_at_end):
    """Parent read by tl.gather or scratch memory, running merge (the default tests cover scratch + final
    merge): the same tree every way."""
    from ddtree_runtime.tree_triton import build_tree_triton

    lp, tok, roots = _tree_inputs(rt, gen, 1, 4, 8, 24, "ties", dev)
    assert_same(build_tree_triton(lp, tok, roots, 24, use_gather=use_gather, merge_at_end=merge_at_end),
                rt.build_tree(lp, tok, roots, 24, impl="torch"), TREE_FIELDS)
