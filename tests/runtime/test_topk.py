"""draft_topk: full-vocab fp32 log-softmax + top-k with the documented order (log-prob desc, token id asc)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rt_env import needs_triton
from rt_helpers import random_logits


def _expected(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent check: full stable sort in numpy of the fp32 log-probs, ties by token id."""
    x = logits.float()
    lp = (x - torch.logsumexp(x, -1, keepdim=True)).numpy()
    batch, depth, vocab = lp.shape
    out_lp = np.empty((batch, depth, k), np.float32)
    out_tok = np.empty((batch, depth, k), np.int64)
    for b in range(batch):
        for d in range(depth):
            order = np.lexsort((np.arange(vocab), -lp[b, d].astype(np.float64)))[:k]
            out_lp[b, d], out_tok[b, d] = lp[b, d, order], order
    return out_lp, out_tok


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


@needs_triton
@pytest.mark.parametrize("batch,depth,vocab,k,kind,dtype", [
    (2, 3, 50, 8, "normal", torch.float32),
    (1, 2, 300, 16, "ties", torch.float32),     # ties across the vocab
    (2, 2, 7, 7, "equal", torch.bfloat16),      # k = V, all equal: pure token-id order
])
def test_kernel_matches_reference(rt, gen, dev, batch, depth, vocab, k, kind, dtype):
    logits = random_logits(gen, batch, depth, vocab, kind).to(dtype).to(dev)
    lp_t, tok_t = rt.draft_topk(logits, k, impl="triton")
    lp_r, tok_r = rt.draft_topk(logits, k, impl="torch")
    assert torch.equal(tok_t, tok_r)
    assert torch.equal(lp_t, lp_r)


@needs_triton
@pytest.mark.parametrize("kind,k", [("normal", 33), ("ties", 5)])
def test_kernel_several_vocab_tiles(rt, gen, dev, kind, k):
    """Small tiles force the two-stage path: 150 tokens in three 64-wide tiles, the last one ragged."""
    from ddtree_runtime.topk_triton import draft_topk_triton

    logits = random_logits(gen, 1, 2, 150, kind).to(dev)
    lp_t, tok_t = draft_topk_triton(logits, k, chunk=64)
    lp_r, tok_r = rt.draft_topk(logits, k, impl="torch")
    assert torch.equal(tok_t, tok_r) and torch.equal(lp_t, lp_r)
