"""build_verify_inputs: ancestor masks equal the paper's visibility matrix; kernel equals reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rt_env import needs_triton
from heap_oracle import visibility
from rt_helpers import VERIFY_FIELDS, assert_same, random_logits


def _tree(rt, gen, batch, depth, vocab, budget, kind="normal", dev="cpu"):
    logits = random_logits(gen, batch, depth, vocab, kind)
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return rt.build_tree(lp.to(dev), tok.to(dev), roots.to(dev), budget, impl="torch")


def _unpack(packed: torch.Tensor, n1: int) -> torch.Tensor:
    words = packed.to(torch.int64) & 0xFFFFFFFF
    bits = (words.unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.flatten(-2)[..., :n1].bool()


@pytest.mark.parametrize("case", [(3, 4, 12, 10, "normal"), (2, 5, 6, 70, "ties"), (2, 2, 2, 12, "normal"),
                                  (1, 6, 30, 1, "peaked")])
def test_reference_matches_visibility_matrix(rt, gen, case):
    batch, depth, vocab, budget, kind = case
    tree = _tree(rt, gen, batch, depth, vocab, budget, kind)
    committed = torch.randint(0, 1000, (batch,), generator=gen)
    vi = rt.build_verify_inputs(tree, committed, impl="torch")
    n1 = budget + 1
    assert vi.mask.shape == (batch, n1, n1) and vi.mask.dtype == torch.bool
    assert vi.packed_mask.shape == (batch, n1, (n1 + 31) // 32) and vi.packed_mask.dtype == torch.int32
    for b in range(batch):
        n = int(tree.num_nodes[b])
        np.testing.assert_array_equal(vi.mask[b, :n, :n].numpy(), visibility(tree.parent[b, :n].tolist()))
        assert torch.equal(vi.mask[b, n:], torch.eye(n1, dtype=torch.bool)[n:]), "unused rows: diagonal only"
        assert not vi.mask[b, :n, n:].any()
    assert torch.equal(_unpack(vi.packed_mask, n1), vi.mask)
    assert torch.equal(vi.positions, committed.view(-1, 1) + tree.depth.long())
    assert torch.equal(vi.retrive_index, torch.arange(batch * n1).view(batch, n1))
    assert torch.equal(vi.retrive_next_token, tree.first_child.long())
    assert torch.equal(vi.retrive_next_sibling, tree.next_sibling.long())
    assert vi.positions.dtype == vi.retrive_index.dtype == vi.retrive_next_token.dtype == torch.int64


def test_packed_mask_sets_word_sign_bit(rt, gen):
    """Node 31 of a chain lands in bit 31 of word 0 (a negative int32) and node 32 in word 1."""
    tree = _tree(rt, gen, 1, 31, 40, 40, "peaked")  # a 31-long chain, the rest branches off it
    vi = rt.build_verify_inputs(tree, torch.zeros(1, dtype=torch.long), impl="torch")
    deep = int((tree.depth[0] == 31).nonzero()[0, 0])
    assert int(vi.packed_mask[0, deep, 0]) < 0
    assert torch.equal(_unpack(vi.packed_mask, 41), vi.mask)


@needs_triton
@pytest.mark.parametrize("case", [(3, 4, 12, 10, "normal"), (2, 5, 6, 40, "ties"), (2, 2, 2, 12, "normal"),
                                  (1, 3, 400, 150, "normal"), (2, 4, 20, 1, "normal")])
def test_kernel_equals_reference(rt, gen, dev, case):
    batch, depth, vocab, budget, kind = case
    tree = _tree(rt, gen, batch, depth, vocab, budget, kind, dev)
    committed = torch.randint(0, 10_000, (batch,), generator=gen).to(dev)
    assert_same(rt.build_verify_inputs(tree, committed, impl="triton"),
                rt.build_verify_inputs(tree, committed, impl="torch"), VERIFY_FIELDS)
