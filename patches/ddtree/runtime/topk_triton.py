"""Per-depth draft candidates with a fused Triton first stage.

Stage 1 (Triton, grid = rows x vocab chunks): normalise a chunk (logit - logsumexp, fp32), pack each entry as
(log-prob order << 24 | token id) and keep the chunk's k smallest keys with a bitonic top-k. Stage 2
(torch.topk on the few surviving int64 keys per row) picks the final k. The log-sum-exp is torch's, shared
with the reference, so log-probs, order and tie-breaks are bit-identical to :mod:`.topk_ref`.
Reads the full-vocab logits once (plus once for the log-sum-exp); no host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from ._triton_keys import score_key, smallest
from .keys import score_from_sort_key
from .topk_ref import TOKEN_BITS

INVALID = tl.constexpr((1 << 63) - 1)


@triton.jit
def _chunk_topk_kernel(x_ptr, lse_ptr, out_ptr, V: tl.constexpr, CHUNKS: tl.constexpr, CHUNK: tl.constexpr,
                       KP: tl.constexpr, TOKEN_SHIFT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = cols < V
    x = tl.load(x_ptr + row * V + cols, mask=inside, other=0.0).to(tl.float32)
    lp = x - tl.load(lse_ptr + row)
    key = tl.where(inside, (score_key(lp) << TOKEN_SHIFT) | cols.to(tl.int64), INVALID)
    tl.store(out_ptr + (row * CHUNKS + chunk) * KP + tl.arange(0, KP), smallest(key, KP))


def draft_topk_triton(draft_logits: torch.Tensor, k: int, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk`` (a power of two >= k) overrides the vocab tile; tests use small ones to get several tiles."""
    batch, depth, vocab = draft_logits.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, V={vocab}], got {k}")
    x = draft_logits.contiguous()
    lse = torch.logsumexp(x.float(), dim=-1).contiguous()
    kp = next_pow2(k)
    chunk = max(kp, chunk or min(2048, next_pow2(vocab)))
    chunks = triton.cdiv(vocab, chunk)
    rows = batch * depth
    cand = torch.empty((rows, chunks * kp), device=x.device, dtype=torch.int64)
    _chunk_topk_kernel[(rows, chunks)](x, lse, cand, V=vocab, CHUNKS=chunks, CHUNK=chunk, KP=kp,
                                       TOKEN_SHIFT=TOKEN_BITS, num_warps=8 if chunk >= 2048 else 4)
    best, _ = torch.topk(cand, k, dim=-1, largest=False, sorted=True)
    best = best.view(batch, depth, k)
    return score_from_sort_key(best >> TOKEN_BITS), best & ((1 << TOKEN_BITS) - 1)
