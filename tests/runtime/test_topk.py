"""draft_topk: full-vocab fp32 log-softmax + top-k with the documented order (logit desc, token id asc).

The kernel (one pass per vocab split, then a merge) is checked against the torch reference and an independent
numpy sort on fresh random inputs each run (the run seed is printed): tokens and order exactly, log-probs to a
few fp32 ulps (the kernel sums its log-sum-exp in another order than torch).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rt_env import needs_triton
from rt_helpers import expected_topk as _expected
from rt_helpers import extreme_logits, random_logits


@pytest.mark.parametrize("kind", ["normal", "ties", "equal", "peaked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_order_and_values(rt, gen, kind, dtype):
    logits = random_logits(gen, 2, 3, 37, kind).to(dtype)
    for k in (1, 5, 37):
        lp, tok = rt.draft_topk(logits, k, impl="torch")
        exp_lp, exp_tok = _expected(logits, k)
        assert lp.dtype == torch.float32 and tok.dtype == torch.int64 and lp.shape == (2, 3, k)
        np.testing.assert_array_equal(tok.numpy(), exp_tok)
        np.testing.assert_array_equal(lp.numpy(), exp_lp)
        assert (lp <= 0).all()
        ref = torch.log_softmax(logits.float(), -1).gather(-1, tok)
        torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)


def test_rejects_bad_k(rt):
    with pytest.raises(ValueError):
        rt.draft_topk(torch.zeros(1, 2, 5), 6, impl="torch")
    with pytest.raises(ValueError):
        rt.draft_topk(torch.zeros(1, 2, 5), 0, impl="torch")


def _close(lp_t: torch.Tensor, lp_r: torch.Tensor) -> None:
    torch.testing.assert_close(lp_t.cpu(), lp_r.cpu(), atol=4e-6, rtol=1e-6, equal_nan=True)


def _kernel(logits, k, **plan):
    from ddtree_runtime.topk_triton import draft_topk_triton

    return draft_topk_triton(logits, k, **plan)


@needs_triton
@pytest.mark.parametrize("batch,depth,vocab,k,kind,dtype,chunk,splits", [
    (2, 3, 50, 8, "normal", torch.float32, None, None),
    (1, 2, 300, 16, "ties", torch.float32, 32, 3),      # ties across tiles and splits: ascending token id
    (2, 2, 7, 7, "equal", torch.bfloat16, None, None),  # k = V, all equal: pure token-id order
    (1, 2, 150, 33, "normal", torch.float32, 64, None),  # 150 = 2 x 64 + 22: the last tile ragged
    (1, 3, 200, 1, "normal", torch.bfloat16, 16, 4),   # k = 1 (the chain's argmax)
    (1, 2, 130, 64, "ties", torch.float32, 64, 2),     # k = chunk size
    (2, 2, 333, 5, "peaked", torch.bfloat16, 16, 5),   # bf16 read as is; one dominant token per depth
])
def test_kernel_matches_reference(rt, gen, dev, batch, depth, vocab, k, kind, dtype, chunk, splits):
    logits = random_logits(gen, batch, depth, vocab, kind).to(dtype).to(dev)
    lp_t, tok_t = _kernel(logits, k, chunk=chunk, splits=splits)
    lp_r, tok_r = rt.draft_topk(logits, k, impl="torch")
    exp_lp, exp_tok = _expected(logits.cpu(), k)
    assert lp_t.dtype == torch.float32 and tok_t.dtype == torch.int64 and lp_t.shape == (batch, depth, k)
    assert torch.equal(tok_t.cpu(), tok_r.cpu()) and np.array_equal(tok_t.cpu().numpy(), exp_tok)
    _close(lp_t, lp_r)
    _close(lp_t, torch.from_numpy(exp_lp))


@needs_triton
def test_kernel_extreme_logits(rt, gen, dev):
    """-inf entries (masked tokens), huge finite logits (online max rescaling), signed zeros, a row with fewer
    finite entries than k: -inf candidates then come in token-id order, as in the reference."""
    x = extreme_logits(gen, 97)
    for k in (1, 9):
        lp_t, tok_t = _kernel(x.to(dev), k, chunk=16, splits=3)
        lp_r, tok_r = rt.draft_topk(x, k, impl="torch")
        assert torch.equal(tok_t.cpu(), tok_r), k
        _close(lp_t, lp_r)
    assert sorted(tok_t[0, 3, :5].tolist()) == [0, 1, 2, 3, 4] and tok_t[0, 3, 5:].tolist() == [5, 6, 7, 8]
    assert torch.isinf(lp_t[0, 3, 5:]).all()


@needs_triton
def test_kernel_default_plan_at_a_real_vocab(rt, gen, dev):
    """The plan the GPU uses (2048-wide tiles, several splits) over a 151,936-token row (Qwen3's vocab)."""
    logits = (torch.randn(1, 1, 151_936, generator=gen) * 2.5).to(torch.bfloat16).to(dev)
    lp_t, tok_t = rt.draft_topk(logits, 16, impl="triton")
    lp_r, tok_r = rt.draft_topk(logits, 16, impl="torch")
    assert torch.equal(tok_t.cpu(), tok_r.cpu())
    _close(lp_t, lp_r)
