"""kv_compaction: applying (src, dst) to a KV pool leaves the accepted path contiguous at the front."""
from __future__ import annotations

import torch
from rt_env import needs_triton
from rt_helpers import plant_targets, random_logits


def _walk(rt, gen, batch, depth, vocab, budget, dev="cpu"):
    logits = random_logits(gen, batch, depth, vocab, "normal")
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    tree = rt.build_tree(lp.to(dev), tok.to(dev), roots.to(dev), budget, impl="torch")
    return tree, rt.accept_walk(tree, plant_targets(tree, gen, vocab, 0.8), impl="torch")


def test_reference_compacts_a_kv_pool(rt, gen):
    for budget in (1, 3, 12, 40):  # budget 1 and 3 are below L: paths shorter than L + 1
        tree, walk = _walk(rt, gen, 3, 5, 10, budget)
        n1 = budget + 1
        pool = 3 * n1 + 7
        slots = torch.randperm(pool, generator=gen)[: 3 * n1].view(3, n1)
        src, dst = rt.kv_compaction(walk, slots, impl="torch")
        assert src.shape == dst.shape == (3, tree.max_depth + 1) and src.dtype == torch.int64
        kv = torch.randn(pool, 4, generator=gen)
        before = kv.clone()
        valid = src >= 0
        kv[dst[valid]] = before[src[valid]]
        for b in range(3):
            n = int(walk.accept_len[b]) + 1
            assert valid[b].tolist() == [True] * n + [False] * (src.shape[1] - n)
            path = walk.accepted_nodes[b, :n].long()
            assert torch.equal(kv[slots[b, :n]], before[slots[b, path]])


@needs_triton
def test_kernel_equals_reference(rt, gen, dev):
    for budget in (1, 12):
        _, walk = _walk(rt, gen, 3, 5, 10, budget, dev)
        slots = torch.randperm(3 * (budget + 1), generator=gen).view(3, budget + 1).to(dev)
        got = rt.kv_compaction(walk, slots, impl="triton")
        ref = rt.kv_compaction(walk, slots, impl="torch")
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_nothing_accepted_keeps_only_the_root(rt, gen):
    """Empty acceptance (no child matches): only the root's KV is kept, in place."""
    logits = random_logits(gen, 2, 4, 10, "normal")
    lp, tok = rt.draft_topk(logits, 6, impl="torch")
    tree = rt.build_tree(lp, tok, torch.tensor([1, 2]), 6, impl="torch")
    walk = rt.accept_walk(tree, torch.full_like(tree.token, -5), impl="torch")  # -5 matches no child token
    assert walk.accept_len.tolist() == [0, 0] and walk.bonus_token.tolist() == [-5, -5]
    slots = torch.arange(14).view(2, 7) + 100
    src, dst = rt.kv_compaction(walk, slots, impl="torch")
    assert src.tolist() == dst.tolist() == [[100] + [-1] * 4, [107] + [-1] * 4]
