"""Integer sort keys and the candidate table used by both tree builders.

Why integer keys: the tree's tie-break is a lexicographic order on (-score, depth, parent order, rank). Packing
it into one int64 lets a single ascending sort (torch.sort or tl.sort) realise it exactly, with no float
comparisons that could disagree between the kernel and the reference.

``score_sort_key`` maps an fp32 score to an unsigned 32-bit value that is *smaller for larger scores*
(a monotone bijection of the float bit pattern; NaN is not supported).
"""
from __future__ import annotations

import functools

import torch

RANK_BITS = 11  # ranks and parent positions are < 2048 (budget <= 1024 needs 10 bits)
RANK_MASK = (1 << RANK_BITS) - 1
CAND_SHIFT = 2 * RANK_BITS  # candidate key: score_key << 22 | parent_pos << 11 | rank
GLOBAL_SHIFT = 16  # global key: score_key << 16 | (depth - 1) * stride + pos  (< 2**15)
INVALID_KEY = (1 << 63) - 1
MAX_BUDGET = 1024
MAX_DEPTH = 31


def score_sort_key(score: torch.Tensor) -> torch.Tensor:
    """fp32 [..] -> int64 [..] in [0, 2**32): ascending key = descending score."""
    bits = score.contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order
    return 0x7FFFFFFF - ordered


def score_from_sort_key(key: torch.Tensor) -> torch.Tensor:
    """Exact inverse of :func:`score_sort_key` (int64 -> fp32)."""
    ordered = 0x7FFFFFFF - key
    bits = torch.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(torch.int32).view(torch.float32)


@functools.lru_cache(maxsize=64)
def candidate_pairs(budget: int, k: int) -> tuple[tuple[int, int], ...]:
    """All (parent position i, rank r) with (i + 1) * (r + 1) <= budget and r < k.

    Why this suffices: parents are sorted by key, ranks by log-prob, so child (j, s) with j <= i, s <= r never
    comes after child (i, r) (fp32 addition is monotone; ties fall to parent order, then rank). Child (i, r)
    therefore has at least (i + 1)(r + 1) - 1 predecessors and cannot be among the top ``budget`` children
    when (i + 1)(r + 1) > budget. About budget * ln(budget) pairs (303 for 64, 7689 for 1024).
    """
    pairs = []
    for i in range(budget):
        for r in range(min(k, budget // (i + 1))):
            pairs.append((i, r))
    return tuple(pairs)


@functools.lru_cache(maxsize=64)
def _table_cpu(budget: int, k: int, pad_to: int) -> torch.Tensor:
    pairs = candidate_pairs(budget, k)
    packed = [(i << 16) | r for i, r in pairs] + [-1] * (pad_to - len(pairs))
    if len(packed) != pad_to:
        raise ValueError(f"{len(pairs)} candidates do not fit in {pad_to}")
    return torch.tensor(packed, dtype=torch.int32)


_DEVICE_TABLES: dict[tuple[int, int, int, str], torch.Tensor] = {}


def candidate_table(budget: int, k: int, pad_to: int, device: torch.device) -> torch.Tensor:
    """Packed ``i << 16 | r`` int32 table padded with -1, cached per device.

    The first call per (budget, k, device) copies it to the device; run one warm-up round before CUDA-graph
    capture (as for any graph) so that the copy is not captured.
    """
    key = (budget, k, pad_to, str(device))
    t = _DEVICE_TABLES.get(key)
    if t is None:
        t = _table_cpu(budget, k, pad_to).to(device)
        _DEVICE_TABLES[key] = t
    return t


_DEVICE_INDEX: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def candidate_index(budget: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(parent positions, ranks) of :func:`candidate_pairs` as int64 device tensors, cached per device."""
    key = (budget, k, str(device))
    t = _DEVICE_INDEX.get(key)
    if t is None:
        pairs = torch.tensor(candidate_pairs(budget, k), dtype=torch.int64).reshape(-1, 2)
        t = (pairs[:, 0].contiguous().to(device), pairs[:, 1].contiguous().to(device))
        _DEVICE_INDEX[key] = t
    return t
