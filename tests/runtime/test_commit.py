"""path_first_slot_order and gather_path: committing the accepted path by reordering verify slots."""
from __future__ import annotations

import pytest
import torch
from rt_helpers import plant_targets, random_logits


def _walked(rt, gen, batch, depth, vocab, budget, kind="normal", p_follow=0.9):
    lp, tok = rt.draft_topk(random_logits(gen, batch, depth, vocab, kind), min(budget, vocab), impl="torch")
    tree = rt.build_tree(lp, tok, torch.randint(0, vocab, (batch,), generator=gen), budget, impl="torch")
    walk = rt.accept_walk(tree, plant_targets(tree, gen, vocab, p_follow), impl="torch")
    return tree, walk


@pytest.mark.parametrize("case", [(4, 5, 20, 12, "normal"), (3, 6, 30, 1, "normal"), (2, 8, 50, 40, "peaked"),
                                  (5, 3, 4, 64, "ties"), (2, 15, 100, 3, "peaked")])
def test_slot_order_is_a_path_first_permutation(rt, gen, case):
    batch, depth, vocab, budget, kind = case
    tree, walk = _walked(rt, gen, batch, depth, vocab, budget, kind)
    n1 = budget + 1
    slots = torch.randperm(10 * batch * n1, generator=gen)[: batch * n1].view(batch, n1)
    got = rt.path_first_slot_order(walk.accepted_nodes, slots)
    assert got.dtype == torch.int64 and got.shape == (batch, n1)
    for b in range(batch):
        path = [int(v) for v in walk.accepted_nodes[b] if int(v) >= 0]
        assert len(path) == int(walk.accept_len[b]) + 1 and path[0] == 0
        rest = [i for i in range(n1) if i not in path]
        assert got[b].tolist() == [int(slots[b, i]) for i in path + rest]
        assert sorted(got[b].tolist()) == sorted(slots[b].tolist()), "a permutation: no slot lost or doubled"


def test_slot_order_root_only_keeps_slots(rt, gen):
    """Nothing accepted: the root stays first and every slot stays where it was."""
    nodes = torch.tensor([[0, -1, -1, -1]], dtype=torch.int32)
    slots = torch.tensor([[40, 41, 42, 43, 44, 45]])
    assert rt.path_first_slot_order(nodes, slots).tolist() == [[40, 41, 42, 43, 44, 45]]


def test_slot_order_deepest_chain(rt):
    """A path through the last nodes of the range moves them to the front, the skipped ones after, in order."""
    nodes = torch.tensor([[0, 3, 5], [0, 1, 2]], dtype=torch.int32)
    slots = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])
    assert rt.path_first_slot_order(nodes, slots).tolist() == [[10, 13, 15, 11, 12, 14],
                                                               [20, 21, 22, 23, 24, 25]]


def test_gather_path_widths(rt, gen):
    tree, walk = _walked(rt, gen, 3, 4, 20, 9)
    hidden = torch.randn(3, 10, 6, generator=gen)
    for width in (5, 3, 8):
        got = rt.gather_path(hidden, walk.accepted_nodes, width)
        assert got.shape == (3, width, 6)
        for b in range(3):
            n = int(walk.accept_len[b]) + 1
            for j in range(min(n, width)):
                assert torch.equal(got[b, j], hidden[b, int(walk.accepted_nodes[b, j])])
    tokens = torch.arange(30).view(3, 10)
    assert rt.gather_path(tokens, walk.accepted_nodes).shape == (3, 5)
