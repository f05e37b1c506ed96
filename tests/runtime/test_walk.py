"""sample_target_tokens and accept_walk: the walk equals a plain dict walk; sampling is exact in law."""
from __future__ import annotations

import pytest
import torch
from rt_env import needs_triton
from rt_helpers import WALK_FIELDS, assert_same, plant_targets, python_walk, random_logits


def _tree(rt, gen, batch, depth, vocab, budget, kind="normal", dev="cpu"):
    logits = random_logits(gen, batch, depth, vocab, kind)
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return rt.build_tree(lp.to(dev), tok.to(dev), roots.to(dev), budget, impl="torch")


def _check_walk(tree, target, walk):
    width = tree.max_depth + 1
    for b in range(tree.parent.shape[0]):
        path, toks = python_walk(tree.parent[b].tolist(), tree.token[b].tolist(), target[b].tolist(),
                                 tree.max_depth)
        n = len(path)
        assert int(walk.accept_len[b]) == n - 1
        assert walk.accepted_nodes[b].tolist() == path + [-1] * (width - n)
        assert walk.accepted_tokens[b].tolist() == toks + [-1] * (width - n)
        assert int(walk.bonus_token[b]) == toks[-1] == int(target[b, path[-1]])
        # accepted draft tokens are the path's node tokens
        assert toks[:-1] == [int(tree.token[b, i]) for i in path[1:]]


@pytest.mark.parametrize("case", [(3, 4, 12, 10, "normal"), (2, 5, 6, 40, "ties"), (2, 6, 30, 6, "peaked"),
                                  (2, 3, 20, 1, "normal"), (2, 2, 2, 12, "normal")])
def test_reference_walk_equals_dict_walk(rt, gen, case):
    batch, depth, vocab, budget, kind = case
    tree = _tree(rt, gen, batch, depth, vocab, budget, kind)
    for p_follow in (0.0, 0.7, 1.0):
        target = plant_targets(tree, gen, vocab, p_follow)
        walk = rt.accept_walk(tree, target, impl="torch")
        assert walk.accepted_nodes.dtype == walk.accept_len.dtype == torch.int32
        assert walk.accepted_tokens.dtype == walk.bonus_token.dtype == torch.int64
        _check_walk(tree, target, walk)


def test_full_depth_and_empty_walks(rt, gen):
    tree = _tree(rt, gen, 2, 6, 30, 6, "peaked")  # a chain of depth 6
    target = plant_targets(tree, gen, 30, 1.0)
    walk = rt.accept_walk(tree, target, impl="torch")
    assert walk.accept_len.tolist() == [6, 6]
    assert walk.accepted_nodes.tolist() == [[0, 1, 2, 3, 4, 5, 6]] * 2
    miss = (tree.token.roll(-1, 1) + 1) % 30  # never a child's token at any node (children are node i+1)
    walk = rt.accept_walk(tree, miss, impl="torch")
    assert walk.accept_len.tolist() == [0, 0]
    assert walk.accepted_tokens[:, 0].tolist() == walk.bonus_token.tolist() == miss[:, 0].tolist()


@needs_triton
@pytest.mark.parametrize("case", [(3, 4, 12, 10, "normal"), (2, 5, 6, 40, "ties"), (2, 6, 30, 6, "peaked"),
                                  (2, 3, 20, 1, "normal"), (2, 2, 2, 12, "normal")])
def test_kernel_walk_equals_reference(rt, gen, dev, case):
    batch, depth, vocab, budget, kind = case
    tree = _tree(rt, gen, batch, depth, vocab, budget, kind, dev)
    for p_follow in (0.0, 0.9):
        target = plant_targets(tree, gen, vocab, p_follow)
        assert_same(rt.accept_walk(tree, target, impl="triton"), rt.accept_walk(tree, target, impl="torch"),
                    WALK_FIELDS)


def _greedy_logits(gen, batch, n1, vocab):
    x = torch.randint(-3, 3, (batch, n1, vocab), generator=gen).float()  # repeated maxima: first index wins
    return x


def test_reference_greedy_is_first_argmax(rt, gen):
    x = _greedy_logits(gen, 3, 5, 17)
    got = rt.sample_target_tokens(x, 0.0, impl="torch")
    first = torch.tensor([[row.tolist().index(max(row.tolist())) for row in xb] for xb in x])
    assert torch.equal(got, first)
    mixed = rt.sample_target_tokens(x, torch.tensor([0.0, 1.0, 0.0]), impl="torch")
    assert torch.equal(mixed[[0, 2]], first[[0, 2]])


@needs_triton
def test_kernel_greedy_equals_reference(rt, gen, dev):
    x = _greedy_logits(gen, 2, 5, 300).to(dev)
    for t in (0.0, torch.tensor([0.0, 0.0], device=dev)):
        assert torch.equal(rt.sample_target_tokens(x, t, impl="triton"), rt.sample_target_tokens(x, t, impl="torch"))
    mixed = rt.sample_target_tokens(x, torch.tensor([1.0, 0.0], device=dev), impl="triton")
    assert torch.equal(mixed[1], x[1].argmax(-1))


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens.flatten().cpu(), minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


# chi-square 99.99% quantile for 4 degrees of freedom (5 categories)
CHI2_4DF_1E4 = 23.51


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_reference_sampling_follows_softmax(rt, gen, temperature):
    base = torch.tensor([1.0, 0.0, -1.0, 0.5, -0.3])
    x = base.expand(8, 250, 5).contiguous()  # 2000 independent draws
    tokens = rt.sample_target_tokens(x, temperature, generator=gen, impl="torch")
    assert _chi_square(tokens, torch.softmax(base / temperature, 0)) < CHI2_4DF_1E4


@needs_triton
def test_kernel_sampling_follows_softmax(rt, gen, dev):
    """160 draws at T = 2 (interpreted kernels are slow on CPU; the GPU test draws far more)."""
    base = torch.tensor([1.0, 0.0, -1.0, 0.5, -0.3])
    temperature = 2.0
    x = base.expand(2, 80, 5).contiguous().to(dev)
    g = torch.Generator(device=dev)
    g.manual_seed(int(torch.randint(0, 1 << 30, (), generator=gen)))
    tokens = rt.sample_target_tokens(x, temperature, generator=g, impl="triton")
    assert _chi_square(tokens, torch.softmax(base / temperature, 0)) < CHI2_4DF_1E4
    again = rt.sample_target_tokens(x[:, :20], temperature, generator=g, impl="triton")
    assert not torch.equal(tokens[:, :20], again), "each call draws fresh noise"
