"""The threshold-then-gather top-k (topk_select_triton): exact against the torch reference and a numpy sort.

Fresh random inputs each run (the run seed is printed). Small group / chunk / candidate-buffer sizes make small
vocabularies cross every block boundary; each case also states which path its rows must take (the gather, or the
exact fallback when the candidate buffer overflows), so a test cannot pass on the fallback alone.
"""
from __future__ import annotations

import pytest
import torch
from rt_env import needs_triton
from rt_helpers import expected_topk, extreme_logits, random_logits


def _close(lp_t: torch.Tensor, lp_r: torch.Tensor) -> None:
    torch.testing.assert_close(lp_t.cpu(), lp_r.cpu(), atol=4e-6, rtol=1e-6, equal_nan=True)


def _select(logits, k, **plan):
    from ddtree_runtime.topk_select_triton import topk_logits_lse

    return topk_logits_lse(logits, k, return_overflow=True, **plan)


def _check(rt, logits, k, numpy_oracle=True, **plan):
    """Kernel == reference (tokens exactly, log-probs to ulps) == numpy sort; returns the overflow flags.
    (numpy ranks -0.0 and +0.0 as equal, the reference puts +0.0 first: signed-zero rows skip the numpy check.)"""
    lp_t, tok_t, lse_t, over = _select(logits, k, **plan)
    lp_r, tok_r, lse_r = rt.topk_logits_lse(logits.cpu(), k, impl="torch")
    assert lp_t.dtype == torch.float32 and tok_t.dtype == torch.int64 and lp_t.shape == logits.shape[:-1] + (k,)
    assert torch.equal(tok_t.cpu(), tok_r), (tok_t, tok_r)
    _close(lp_t, lp_r)
    _close(lse_t, lse_r)
    if numpy_oracle:
        exp_lp, exp_tok = expected_topk(logits.cpu(), k)
        assert torch.equal(tok_t.cpu(), torch.from_numpy(exp_tok))
        _close(lp_t, torch.from_numpy(exp_lp))
    return over.cpu()


@needs_triton
@pytest.mark.parametrize("batch,depth,vocab,k,kind,dtype,plan,path", [
    (2, 3, 1000, 16, "normal", torch.bfloat16, dict(group=16, chunk=64), "gather"),
    (1, 2, 777, 64, "normal", torch.float32, dict(group=8, chunk=32, splits=3), "gather"),  # k > group; ragged V
    (1, 3, 500, 1, "normal", torch.bfloat16, dict(group=16, chunk=64), "gather"),  # k = 1: the chain's argmax
    (2, 2, 613, 16, "peaked", torch.bfloat16, dict(group=16, chunk=128, splits=2), "gather"),
    (1, 2, 300, 16, "ties", torch.float32, dict(group=16, chunk=64), "gather"),  # V <= cap: every tie fits
    (2, 2, 7, 7, "equal", torch.bfloat16, {}, "gather"),  # k = V, all equal: pure token-id order
    (1, 2, 300, 16, "ties", torch.float32, dict(group=16, chunk=64, cap=32), "fallback"),  # ties overflow
    (1, 2, 2000, 8, "equal", torch.bfloat16, dict(group=16, chunk=64, cap=64), "fallback"),  # uniform row
])
def test_select_matches_reference(rt, gen, dev, batch, depth, vocab, k, kind, dtype, plan, path):
    logits = random_logits(gen, batch, depth, vocab, kind).to(dtype).to(dev)
    over = _check(rt, logits, k, **plan)
    assert bool((over == (1 if path == "fallback" else 0)).all()), over


@needs_triton
def test_overflowing_and_gathered_rows_in_one_launch(rt, gen, dev):
    """Near-uniform rows (bf16 noise far below one ulp of the logits: thousands of exact ties) overflow a small
    candidate buffer and are finished by the exact kernel; their neighbours in the same launch are gathered."""
    x = random_logits(gen, 1, 4, 1500, "normal")
    x[0, 1] = 8.0 + 1e-4 * torch.randn(1500, generator=gen)
    x[0, 3, :] = 0.0
    x[0, 3, 1499] = 1.0
    x = x.to(torch.bfloat16).to(dev)
    over = _check(rt, x, 24, group=16, chunk=64, cap=128)
    assert over[0].tolist() == [0, 1, 0, 1], over


@needs_triton
def test_select_extreme_logits(rt, gen, dev):
    """-inf entries (masked tokens), huge finite logits, signed zeros, a row with fewer finite entries than k
    (then T = -inf: all of the row is gathered, or, past the buffer, the exact fallback)."""
    x = extreme_logits(gen, 197)
    for k, cap, want in ((1, None, [0, 0, 0, 0]), (9, None, [0, 0, 0, 0]), (9, 64, [0, 0, 1, 1])):
        over = _check(rt, x.to(dev), k, numpy_oracle=False, group=8, chunk=32, cap=cap)
        assert over[0].tolist() == want, (k, cap, over)
    lp_t, tok_t, _, _ = _select(x.to(dev), 9, group=8, chunk=32)
    assert sorted(tok_t[0, 3, :5].tolist()) == [0, 1, 2, 3, 4] and tok_t[0, 3, 5:].tolist() == [5, 6, 7, 8]
    assert torch.isinf(lp_t[0, 3, 5:]).all()
    assert tok_t[0, 2].tolist() == list(range(0, 18, 2))  # +0.0 ranks above -0.0, as in the reference


@needs_triton
@pytest.mark.parametrize("module,plan", [("topk_select_triton", dict(group=16, chunk=64)),
                                         ("topk_triton", dict(chunk=32, splits=2))])
def test_raw_values_and_lse_strided_rows(rt, gen, dev, module, plan):
    """sub_lse=False returns the logits themselves, bit-exact (the tensor-parallel merge's input), and the
    shard's log-sum-exp; a strided row (a slice of a wider buffer) is read in place. Both kernels."""
    import importlib

    topk_logits_lse = importlib.import_module(f"ddtree_runtime.{module}").topk_logits_lse
    wide = random_logits(gen, 2, 3, 520, "normal").to(torch.bfloat16).to(dev)
    x = wide[..., :411]
    assert not x.is_contiguous()
    vals, tok, lse = topk_logits_lse(x, 12, sub_lse=False, **plan)
    v_r, t_r, l_r = rt.topk_logits_lse(x.cpu(), 12, sub_lse=False, impl="torch")
    assert torch.equal(tok.cpu(), t_r) and torch.equal(vals.cpu(), v_r)
    assert torch.equal(vals.cpu(), x.cpu().float().gather(-1, t_r))
    _close(lse, l_r)


@needs_triton
@pytest.mark.slow  # Qwen3's whole vocab through the interpreter; the smaller-vocab cases above stay in make test-fast
@pytest.mark.parametrize("k", [16, 64])
def test_select_default_plan_at_a_real_vocab(rt, gen, dev, k):
    """The GPU's plan (128-token groups, 4096-wide chunks, a 1024-slot buffer) over Qwen3's 151,936 tokens,
    bf16 as the head writes them, through the public dispatch: gathered, not the fallback."""
    logits = (torch.randn(1, 2, 151_936, generator=gen) * 2.5).to(torch.bfloat16).to(dev)
    over = _check(rt, logits, k)
    assert not over.any()
    lp_t, tok_t = rt.draft_topk(logits, k, impl="triton")
    lp_r, tok_r = rt.draft_topk(logits, k, impl="torch")
    assert torch.equal(tok_t.cpu(), tok_r)
    _close(lp_t, lp_r)


@needs_triton
def test_dispatch_takes_the_select_path(rt, gen, dev, monkeypatch):
    """impl='triton' (and CUDA tensors under 'auto') run topk_select_triton, not the older streaming kernel."""
    import ddtree_runtime.topk_select_triton as sel

    calls = []
    real = sel.topk_logits_lse
    monkeypatch.setattr(sel, "topk_logits_lse", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits = random_logits(gen, 1, 2, 64, "normal").to(dev)
    lp, tok = rt.draft_topk(logits, 4, impl="triton")
    assert calls == [1] and torch.equal(tok.cpu(), rt.draft_topk(logits.cpu(), 4, impl="torch")[1])
