"""Per-depth draft candidates in one pass over the logits (Triton): the exact streaming kernel.

The runtime's fast path is :mod:`.topk_select_triton` (threshold then gather); it launches this kernel, gated
per row, for the rows that overflow its candidate buffer. Exact on any row, but compute bound on random-looking
rows (a running-top-k merge per chunk).

The chain's draft head costs one read of the logits (argmax). This kernel is built to cost about the same:

* **Stage 1** (grid = rows x splits, a split being a contiguous run of vocab chunks): each program streams its
  chunks once, keeping an online max / sum-exp (fp32) and its running top-k keys. A chunk whose entries cannot
  beat the running k-th key (tested in int32, no sort) costs nothing more; a chunk with at most k new candidates
  is compacted (prefix sum) into a k-wide slot and merged by a 2k-wide bitonic top-k; only a chunk with more
  candidates (the first one, and rarely later) runs a chunk-wide top-k. So nearly every chunk costs a load,
  an exp and a few integer compares per entry, and the number of programs is a few per SM, not one per chunk.
* **Stage 2** (grid = rows): combines the splits' max / sum-exp into the row's log-sum-exp and their top-k keys
  into the row's top-k, writing log-probs (or raw logits, for the tensor-parallel merge) and token ids.

Keys are (logit order << 24 | token id), ascending = descending logit, ties by ascending token id: the order of
:mod:`.topk_ref`. bf16 / fp16 logits are read as they are (no fp32 copy). No host sync; CUDA-graph capturable.
The log-sum-exp is summed in another order than torch's, so log-probs agree with the reference to a few fp32
ulps; the tokens and their order are exactly the reference's.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from ._triton_keys import score_from_key, score_key, smallest
from .topk_ref import TOKEN_BITS, check_topk_args

INVALID = tl.constexpr((1 << 63) - 1)
INT32_MIN = tl.constexpr(-(1 << 31))
INT32_MAX = tl.constexpr((1 << 31) - 1)
MAX_MERGE = 8192  # stage 2 sorts splits * KP keys per row: at most this many
DEFAULT_CHUNK = 2048
PROGRAMS_PER_SM = 4


@triton.jit
def _ordered(x):
    """fp32 -> int32 whose signed order is the float order (-0 < +0): cheap pre-filter twin of score_key."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _split_topk_kernel(x_ptr, stride_row, m_ptr, s_ptr, sc_ptr, flag_ptr, V, SPLITS, SPLIT_LEN: tl.constexpr,
                       CHUNK: tl.constexpr, KP: tl.constexpr, TOKEN_SHIFT: tl.constexpr, GATED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    run = True
    if GATED:  # the exact fallback of :mod:`.topk_select_triton`: only rows whose flag is set do any work
        run = tl.load(flag_ptr + row) != 0
    if run:
        _split_topk_body(x_ptr, stride_row, m_ptr, s_ptr, sc_ptr, V, SPLITS, SPLIT_LEN, CHUNK, KP, TOKEN_SHIFT, row)


@triton.jit
def _split_topk_body(x_ptr, stride_row, m_ptr, s_ptr, sc_ptr, V, SPLITS, SPLIT_LEN: tl.constexpr,
                     CHUNK: tl.constexpr, KP: tl.constexpr, TOKEN_SHIFT: tl.constexpr, row):
    split = tl.program_id(1)
    prog = row * SPLITS + split
    sc = sc_ptr + prog * (2 * KP)  # [0, KP): running top-k keys (ascending); [KP, 2KP): this chunk's candidates
    lanes = tl.arange(0, KP)
    tl.store(sc + lanes, tl.full([KP], INVALID, tl.int64))
    m = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), 0)
    s = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    thr_ord = tl.min(tl.full([CHUNK], INT32_MIN, tl.int32), 0)  # (INT32_MIN, INT32_MAX): nothing kept yet
    thr_id = tl.max(tl.full([CHUNK], INT32_MAX, tl.int32), 0)
    start = split * SPLIT_LEN
    tl.debug_barrier()
    for c in range(0, SPLIT_LEN, CHUNK):
        cols = start + c + tl.arange(0, CHUNK)
        inside = cols < V
        x = tl.load(x_ptr + row * stride_row + cols, mask=inside, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), 0)
        m = m_new
        ordx = _ordered(x)
        passing = inside & ((ordx > thr_ord) | ((ordx == thr_ord) & (cols < thr_id)))
        count = tl.sum(passing.to(tl.int32), 0)
        if count > 0:
            key = tl.where(passing, (score_key(x) << TOKEN_SHIFT) | cols.to(tl.int64), INVALID)
            if count <= KP:
                slot = tl.cumsum(passing.to(tl.int32), 0) - 1
                tl.store(sc + KP + slot, key, mask=passing)
                tl.store(sc + KP + lanes, tl.full([KP], INVALID, tl.int64), mask=lanes >= count)
            else:
                tl.store(sc + KP + lanes, smallest(key, KP))
            tl.debug_barrier()
            best = smallest(tl.load(sc + tl.arange(0, 2 * KP)), KP)
            tl.debug_barrier()
            tl.store(sc + lanes, best)
            worst = tl.max(best, 0)
            full = worst != INVALID
            thr_ord = tl.where(full, (0x7FFFFFFF - (worst >> TOKEN_SHIFT)).to(tl.int32), INT32_MIN)
            thr_id = tl.where(full, (worst & ((1 << TOKEN_SHIFT) - 1)).to(tl.int32), INT32_MAX)
            tl.debug_barrier()
    tl.store(m_ptr + prog, m)
    tl.store(s_ptr + prog, s)


@triton.jit
def _merge_splits_kernel(sc_ptr, m_ptr, s_ptr, val_ptr, id_ptr, lse_ptr, flag_ptr, SPLITS, K,
                         KP: tl.constexpr, SP: tl.constexpr, CP: tl.constexpr, SUB_LSE: tl.constexpr,
                         TOKEN_SHIFT: tl.constexpr, GATED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    run = True
    if GATED:
        run = tl.load(flag_ptr + row) != 0
    if run:
        _merge_splits_body(sc_ptr, m_ptr, s_ptr, val_ptr, id_ptr, lse_ptr, SPLITS, K, KP, SP, CP, SUB_LSE,
                           TOKEN_SHIFT, row)


@triton.jit
def splits_lse(m_ptr, s_ptr, row, SPLITS, SP: tl.constexpr):
    """A row's log-sum-exp from its splits' online max / sum-exp (-inf for an all -inf row)."""
    i = tl.arange(0, SP)
    mi = tl.load(m_ptr + row * SPLITS + i, mask=i < SPLITS, other=float("-inf"))
    si = tl.load(s_ptr + row * SPLITS + i, mask=i < SPLITS, other=0.0)
    big = tl.max(mi, 0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    return big_safe + tl.log(tl.sum(si * tl.exp(mi - big_safe), 0))


@triton.jit
def _merge_splits_body(sc_ptr, m_ptr, s_ptr, val_ptr, id_ptr, lse_ptr, SPLITS, K, KP: tl.constexpr,
                       SP: tl.constexpr, CP: tl.constexpr, SUB_LSE: tl.constexpr, TOKEN_SHIFT: tl.constexpr, row):
    lse = splits_lse(m_ptr, s_ptr, row, SPLITS, SP)
    j = tl.arange(0, CP)
    keys = tl.load(sc_ptr + (row * SPLITS + j // KP) * (2 * KP) + j % KP, mask=j < SPLITS * KP, other=INVALID)
    top = smallest(keys, KP)
    val = score_from_key(top >> TOKEN_SHIFT)
    if SUB_LSE:
        val = val - lse
    t = tl.arange(0, KP)
    tl.store(val_ptr + row * K + t, val, mask=t < K)
    tl.store(id_ptr + row * K + t, top & ((1 << TOKEN_SHIFT) - 1), mask=t < K)
    tl.store(lse_ptr + row, lse)


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def plan(rows: int, vocab: int, kp: int, chunk: int, device: torch.device) -> tuple[int, int]:
    """(splits, split_len): enough programs to keep every SM streaming (PROGRAMS_PER_SM: a program has one chunk's
    load in flight at a time, so several per SM hide the memory latency), each at least four chunks long (each split
    pays one chunk-wide top-k), and at most MAX_MERGE keys for stage 2 to sort per row."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 4
    chunks = triton.cdiv(vocab, chunk)
    splits = max(1, min(triton.cdiv(PROGRAMS_PER_SM * sms, rows), triton.cdiv(chunks, 4), MAX_MERGE // kp))
    split_len = triton.cdiv(chunks, splits) * chunk
    return triton.cdiv(vocab, split_len), split_len


def rows_of(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Validate, and view [..., V] as [rows, V] with unit column stride (strided rows are read in place)."""
    vocab = int(logits.shape[-1])
    check_topk_args(vocab, k)
    x = logits.reshape(-1, vocab)
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x, tuple(logits.shape[:-1])


def launch_exact(x: torch.Tensor, k: int, vals: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, *,
                 sub_lse: bool, flag: torch.Tensor | None = None, chunk: int | None = None,
                 splits: int | None = None) -> None:
    """The two exact kernels on [rows, V] into ``vals`` / ``ids`` [rows, k] and ``lse`` [rows]. With ``flag``
    (int32 [rows]) only the flagged rows are computed: the others' programs return at once, so the launch has a
    fixed grid (CUDA-graph capturable) and costs next to nothing when no row is flagged."""
    rows, vocab = int(x.shape[0]), int(x.shape[1])
    kp = next_pow2(k)
    chunk = max(kp, next_pow2(chunk or min(DEFAULT_CHUNK, next_pow2(vocab))))
    if splits is None:
        n_splits, split_len = plan(rows, vocab, kp, chunk, x.device)
    else:
        split_len = triton.cdiv(triton.cdiv(vocab, chunk), splits) * chunk
        n_splits = triton.cdiv(vocab, split_len)
    m = torch.empty((rows * n_splits,), device=x.device, dtype=torch.float32)
    s = torch.empty_like(m)
    scratch = torch.empty((rows * n_splits, 2 * kp), device=x.device, dtype=torch.int64)
    gated = flag is not None
    flag = flag if gated else m  # never read when not gated
    _split_topk_kernel[(rows, n_splits)](x, x.stride(0), m, s, scratch, flag, vocab, n_splits, split_len,
                                         CHUNK=chunk, KP=kp, TOKEN_SHIFT=TOKEN_BITS, GATED=gated,
                                         num_warps=8 if chunk >= 2048 else 4)
    _merge_splits_kernel[(rows,)](scratch, m, s, vals, ids, lse, flag, n_splits, k, KP=kp,
                                  SP=next_pow2(n_splits, 2), CP=next_pow2(n_splits * kp), SUB_LSE=sub_lse,
                                  TOKEN_SHIFT=TOKEN_BITS, GATED=gated,
                                  num_warps=4 if n_splits * kp <= 1024 else 8)


def topk_logits_lse(logits: torch.Tensor, k: int, *, sub_lse: bool = True, chunk: int | None = None,
                    splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., V] -> (values fp32 [..., k], token ids int64 [..., k], log-sum-exp fp32 [...]).

    Values are log-probs (logit - lse) when ``sub_lse``, else the raw fp32 logits (what a tensor-parallel rank
    gathers). ``chunk`` (a power of two) and ``splits`` override the plan; tests use small ones to cross tiles.
    """
    x, lead = rows_of(logits, k)
    rows = int(x.shape[0])
    vals = torch.empty((rows, k), device=x.device, dtype=torch.float32)
    ids = torch.empty((rows, k), device=x.device, dtype=torch.int64)
    lse = torch.empty((rows,), device=x.device, dtype=torch.float32)
    if rows:
        launch_exact(x, k, vals, ids, lse, sub_lse=sub_lse, chunk=chunk, splits=splits)
    return vals.view(*lead, k), ids.view(*lead, k), lse.view(lead)


def draft_topk_triton(draft_logits: torch.Tensor, k: int, chunk: int | None = None,
                      splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, V] -> (log-probs fp32 [B, L, k], tokens int64 [B, L, k]), the order of :mod:`.topk_ref`."""
    lp, tok, _ = topk_logits_lse(draft_logits, k, chunk=chunk, splits=splits)
    return lp, tok
