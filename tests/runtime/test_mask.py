"""write_verify_mask: the flat per-request verify mask SGLang's backends read; kernel equals reference equals a
plain-Python oracle of the layout, and the tree-only form never touches the context columns."""
from __future__ import annotations

import pytest
import torch
from rt_env import needs_triton
from rt_helpers import random_logits

SENTINEL = 7  # a value no write produces: cells left alone keep it


def _tree_mask(rt, gen, batch, depth, vocab, budget, kind="normal"):
    lp, tok = rt.draft_topk(random_logits(gen, batch, depth, vocab, kind), min(budget, vocab), impl="torch")
    tree = rt.build_tree(lp, tok, torch.randint(0, vocab, (batch,), generator=gen), budget, impl="torch")
    return rt.build_verify_inputs(tree, torch.zeros(batch, dtype=torch.long), impl="torch").mask


def _oracle(tree_mask: torch.Tensor, prefix: list[int], total: int, prefix_cols: bool) -> list[int]:
    """Cell by cell, as the triton backend's mask_indptr / row stride address them."""
    batch, n1, _ = tree_mask.shape
    out = [SENTINEL] * total
    start = 0
    for b in range(batch):
        row_len = prefix[b] + n1
        for i in range(n1):
            for c in range(row_len):
                if c >= prefix[b]:
                    out[start + i * row_len + c] = int(tree_mask[b, i, c - prefix[b]])
                elif prefix_cols:
                    out[start + i * row_len + c] = 1
        start += n1 * row_len
    return out


CASES = [(3, 4, 12, 10, [5, 0, 17]), (1, 3, 9, 1, [3]), (2, 5, 6, 40, [0, 0]), (4, 2, 30, 7, [1, 2, 33, 4]),
         (2, 6, 50, 64, [70, 3])]


@pytest.mark.parametrize("prefix_cols", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_reference_matches_layout_oracle(rt, gen, case, prefix_cols):
    batch, depth, vocab, budget, prefix = case
    tm = _tree_mask(rt, gen, batch, depth, vocab, budget, "ties" if budget > 20 else "normal")
    n1 = budget + 1
    need = rt.mask_numel(sum(prefix), batch, n1)
    out = torch.full((need + 11,), SENTINEL, dtype=torch.uint8)  # a larger buffer: the tail must stay untouched
    got = rt.write_verify_mask(tm, torch.tensor(prefix), out, prefix_cols=prefix_cols, max_prefix=max(prefix),
                               impl="torch")
    assert got is out
    assert out.tolist() == _oracle(tm, prefix, need, prefix_cols) + [SENTINEL] * 11
    assert torch.equal(rt.mask_offsets(torch.tensor(prefix), n1),
                       torch.tensor([sum(n1 * (p + n1) for p in prefix[:b]) for b in range(batch)]))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool])
@pytest.mark.parametrize("prefix_cols", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_kernel_equals_reference(rt, gen, dev, case, prefix_cols, dtype):
    batch, depth, vocab, budget, prefix = case
    tm = _tree_mask(rt, gen, batch, depth, vocab, budget).to(dev)
    n1 = budget + 1
    need = rt.mask_numel(sum(prefix), batch, n1)
    fill = True if dtype == torch.bool else SENTINEL
    ref = torch.full((need + 5,), fill, dtype=dtype, device=dev)
    ker = ref.clone()
    if dtype == torch.bool:  # bool cannot hold a sentinel: start from all-visible and expect the zeros to land
        ref.fill_(True), ker.fill_(True)
    pl = torch.tensor(prefix, device=dev)
    bound = max(prefix) + 3  # any host upper bound works
    rt.write_verify_mask(tm, pl, ref, prefix_cols=prefix_cols, max_prefix=bound, impl="torch")
    rt.write_verify_mask(tm, pl, ker, prefix_cols=prefix_cols, max_prefix=bound, impl="triton")
    assert torch.equal(ker.cpu(), ref.cpu())


def test_tree_only_write_is_a_small_fraction(rt, gen):
    """The point of the default: cells written are B * N1^2, not N1 * (context + N1) per request."""
    tm = _tree_mask(rt, gen, 2, 4, 40, 16)
    prefix = [1000, 3000]
    out = torch.full((rt.mask_numel(sum(prefix), 2, 17),), SENTINEL, dtype=torch.uint8)
    rt.write_verify_mask(tm, torch.tensor(prefix), out, impl="torch")
    written = int((out != SENTINEL).sum())
    assert written == 2 * 17 * 17
    assert written * 100 < out.numel()


def test_refuses_bad_output_and_missing_bound(rt, gen):
    tm = _tree_mask(rt, gen, 1, 3, 10, 4)
    with pytest.raises(ValueError, match="bool or uint8"):
        rt.write_verify_mask(tm, torch.tensor([2]), torch.zeros(100, dtype=torch.float32))
    with pytest.raises(ValueError, match="max_prefix"):
        rt.write_verify_mask(tm, torch.tensor([2]), torch.zeros(100, dtype=torch.uint8), prefix_cols=True,
                             impl="torch")


def test_empty_batch_is_a_no_op(rt):
    out = torch.full((4,), SENTINEL, dtype=torch.uint8)
    rt.write_verify_mask(torch.zeros((0, 3, 3), dtype=torch.bool), torch.zeros(0, dtype=torch.long), out)
    assert out.tolist() == [SENTINEL] * 4
