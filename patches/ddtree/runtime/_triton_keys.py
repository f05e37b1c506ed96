"""Triton twins of :mod:`.keys` (score <-> sort-key maps); kept separate so pure-torch imports stay light."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def score_key(score):
    """fp32 -> int64 in [0, 2**32): ascending key = descending score (same map as keys.score_sort_key)."""
    bits = score.to(tl.int32, bitcast=True).to(tl.int64)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return 0x7FFFFFFF - ordered


@triton.jit
def score_from_key(key):
    """Exact inverse of :func:`score_key` (int64 -> fp32)."""
    ordered = 0x7FFFFFFF - key
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def smallest(keys, K: tl.constexpr):
    """The K smallest int64 keys of a 1-D block, ascending (tl.topk works descending, so complement)."""
    return ~tl.topk(~keys, K)
