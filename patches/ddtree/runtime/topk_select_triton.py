"""Per-depth draft candidates by threshold-then-gather (Triton): about one read of the logits, exact.

:mod:`.topk_triton` keeps a running top-k while it streams the row; on random-looking rows nearly every chunk
brings a new candidate, so it pays a merge per chunk and is compute bound (7-11x the chain's argmax on an H200 at
batch 32). This path moves all ordering work onto a few hundred elements per row:

* **Pass 1** (grid = rows x splits): stream the row once; online max / sum-exp (fp32) for the log-sum-exp, and
  the max of every group of ``GROUP`` consecutive tokens (``cdiv(V, GROUP)`` group maxes per row).
* **Pass 2** (grid = rows): ``T`` = the k-th largest group max. k groups each hold an entry >= T, so the row's
  k-th largest logit is >= T and every top-k entry is >= T: gathering all entries >= T (ties included) from the
  groups whose max is >= T loses nothing. Only those groups are read again (about k of them: ~k * GROUP entries,
  a few percent of the row); the gathered keys (logit order << 24 | token id) are compacted into a per-row
  buffer of ``cap`` slots, and a top-k of that buffer gives the row's ranks: descending logit, ties by ascending
  token id, the order of :mod:`.topk_ref`.
* **Overflow** (more than ``cap`` entries >= T, e.g. a near-uniform row or one with fewer finite entries than
  k): the row's flag is set and the exact kernels of :mod:`.topk_triton` are launched with that flag; their
  programs return at once for unflagged rows. Fixed grids, no host sync: CUDA-graph capturable.

The log-sum-exp is summed in another order than torch's (log-probs agree to a few fp32 ulps); tokens and their
order are exactly the reference's. bf16 / fp16 logits are read as they are.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from ._triton_keys import score_from_key, score_key, smallest
from .topk_ref import TOKEN_BITS
from .topk_triton import _sm_count, launch_exact, rows_of, splits_lse

INVALID = tl.constexpr((1 << 63) - 1)
DEFAULT_GROUP = 128  # 256 bytes of bf16 per group: 1,187 groups over Qwen3's 151,936 tokens
DEFAULT_CHUNK = 4096  # entries per pass-1 load (several 16-byte loads in flight per thread)
PROGRAMS_PER_SM = 4
GATHER_BLOCK = 2048  # entries per pass-2 load (GATHER_BLOCK // GROUP groups)
MIN_CAP = 1024  # candidate slots per row (at least 8k)


@triton.jit
def _group_max_lse_kernel(x_ptr, stride_row, gmax_ptr, m_ptr, s_ptr, V, NG, SPLITS,
                          SPLIT_LEN: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr):
    """Pass 1: this split's online max / sum-exp and the max of each of its GROUP-wide groups."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    m = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), 0)
    s = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    start = split * SPLIT_LEN
    gl = tl.arange(0, CHUNK // GROUP)
    for c in range(0, SPLIT_LEN, CHUNK):
        cols = start + c + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), 0)
        m = m_new
        g = (start + c) // GROUP + gl
        tl.store(gmax_ptr + row * NG + g, tl.max(tl.reshape(x, [CHUNK // GROUP, GROUP]), 1), mask=g < NG)
    tl.store(m_ptr + row * SPLITS + split, m)
    tl.store(s_ptr + row * SPLITS + split, s)


@triton.jit
def _threshold_gather_kernel(x_ptr, stride_row, gmax_ptr, m_ptr, s_ptr, gidx_ptr, cand_ptr, flag_ptr,
                             val_ptr, id_ptr, lse_ptr, V, NG, SPLITS, K,
                             GROUP: tl.constexpr, NGP: tl.constexpr, SP: tl.constexpr, KP: tl.constexpr,
                             CAP: tl.constexpr, BLOCK: tl.constexpr, SUB_LSE: tl.constexpr,
                             TOKEN_SHIFT: tl.constexpr):
    """Pass 2: log-sum-exp, threshold T, gather of the entries >= T, their top-k (or the overflow flag)."""
    row = tl.program_id(0).to(tl.int64)
    lse = splits_lse(m_ptr, s_ptr, row, SPLITS, SP)
    tl.store(lse_ptr + row, lse)

    g = tl.arange(0, NGP)
    gm = tl.load(gmax_ptr + row * NG + g, mask=g < NG, other=float("-inf"))
    r = tl.arange(0, KP)
    thr = tl.min(tl.where(r < K, tl.topk(gm, KP), float("inf")), 0)  # the k-th largest group max
    sel = (g < NG) & (gm >= thr)
    n_sel = tl.sum(sel.to(tl.int32), 0)
    slot = tl.cumsum(sel.to(tl.int32), 0) - 1
    gidx = gidx_ptr + row * CAP
    tl.store(gidx + slot, g, mask=sel & (slot < CAP))
    tl.debug_barrier()
    # Every selected group holds an entry >= T, so n_sel > CAP already means overflow: read at most CAP groups.
    n_read = tl.where(n_sel < CAP, n_sel, CAP)
    j = tl.arange(0, BLOCK)
    cand = cand_ptr + row * CAP
    count = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    b = 0
    while b < n_read:  # (a while loop: the interpreter cannot take a tensor as a range bound)
        gi = b + j // GROUP
        grp = tl.load(gidx + gi, mask=gi < n_read, other=NG)
        cols = grp * GROUP + j % GROUP  # group NG lies past the vocab: masked
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        hit = (cols < V) & (x >= thr)
        pos = count + tl.cumsum(hit.to(tl.int32), 0) - 1
        tl.store(cand + pos, (score_key(x) << TOKEN_SHIFT) | cols.to(tl.int64), mask=hit & (pos < CAP))
        count += tl.sum(hit.to(tl.int32), 0)
        b += BLOCK // GROUP
    over = ((count > CAP) | (n_sel > CAP)).to(tl.int32)
    tl.store(flag_ptr + row, over)
    tl.debug_barrier()
    if over == 0:
        c = tl.arange(0, CAP)
        top = smallest(tl.load(cand + c, mask=c < count, other=INVALID), KP)
        val = score_from_key(top >> TOKEN_SHIFT)
        if SUB_LSE:
            val = val - lse
        tl.store(val_ptr + row * K + r, val, mask=r < K)
        tl.store(id_ptr + row * K + r, top & ((1 << TOKEN_SHIFT) - 1), mask=r < K)


def plan(rows: int, vocab: int, chunk: int, device: torch.device) -> tuple[int, int]:
    """(splits, split_len) of pass 1: enough programs to keep every SM streaming (a few per SM hide the memory
    latency), a split being a whole number of chunks (so groups never straddle two programs)."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 4
    chunks = triton.cdiv(vocab, chunk)
    splits = max(1, min(triton.cdiv(PROGRAMS_PER_SM * sms, rows), chunks))
    split_len = triton.cdiv(chunks, splits) * chunk
    return triton.cdiv(vocab, split_len), split_len


def shapes(vocab: int, k: int, group: int | None = None, chunk: int | None = None,
           cap: int | None = None) -> dict:
    """The block sizes for one (V, k): powers of two, chunk a multiple of group, cap >= 8k and >= k."""
    kp = next_pow2(k)
    group = next_pow2(group or DEFAULT_GROUP, 2)
    chunk = max(group, next_pow2(chunk or min(DEFAULT_CHUNK, next_pow2(vocab))))
    n_groups = triton.cdiv(vocab, group)
    cap = max(kp, next_pow2(cap or max(MIN_CAP, 8 * kp)))
    return dict(kp=kp, group=group, chunk=chunk, n_groups=n_groups, ngp=next_pow2(max(n_groups, kp)), cap=cap,
                block=max(group, min(GATHER_BLOCK, cap * group)))


def topk_logits_lse(logits: torch.Tensor, k: int, *, sub_lse: bool = True, group: int | None = None,
                    chunk: int | None = None, cap: int | None = None, splits: int | None = None,
                    return_overflow: bool = False):
    """[..., V] -> (values fp32 [..., k], token ids int64 [..., k], log-sum-exp fp32 [...]).

    Values are log-probs (logit - lse) when ``sub_lse``, else the raw fp32 logits (what a tensor-parallel rank
    gathers). ``group``, ``chunk``, ``cap`` and ``splits`` override the plan (tests use small ones to cross
    blocks and to force the overflow path); ``return_overflow`` adds the per-row overflow flags (int32 [...]).
    """
    x, lead = rows_of(logits, k)
    rows, vocab = int(x.shape[0]), int(x.shape[1])
    dev = x.device
    vals = torch.empty((rows, k), device=dev, dtype=torch.float32)
    ids = torch.empty((rows, k), device=dev, dtype=torch.int64)
    lse = torch.empty((rows,), device=dev, dtype=torch.float32)
    flag = torch.zeros((rows,), device=dev, dtype=torch.int32)
    if rows:
        sh = shapes(vocab, k, group, chunk, cap)
        if splits is None:
            n_splits, split_len = plan(rows, vocab, sh["chunk"], dev)
        else:
            split_len = triton.cdiv(triton.cdiv(vocab, sh["chunk"]), splits) * sh["chunk"]
            n_splits = triton.cdiv(vocab, split_len)
        gmax = torch.empty((rows, sh["n_groups"]), device=dev, dtype=torch.float32)
        m = torch.empty((rows * n_splits,), device=dev, dtype=torch.float32)
        s = torch.empty_like(m)
        gidx = torch.empty((rows, sh["cap"]), device=dev, dtype=torch.int32)
        cand = torch.empty((rows, sh["cap"]), device=dev, dtype=torch.int64)
        _group_max_lse_kernel[(rows, n_splits)](x, x.stride(0), gmax, m, s, vocab, sh["n_groups"], n_splits,
                                                SPLIT_LEN=split_len, CHUNK=sh["chunk"], GROUP=sh["group"],
                                                num_warps=8 if sh["chunk"] >= 2048 else 4)
        _threshold_gather_kernel[(rows,)](x, x.stride(0), gmax, m, s, gidx, cand, flag, vals, ids, lse, vocab,
                                          sh["n_groups"], n_splits, k, GROUP=sh["group"], NGP=sh["ngp"],
                                          SP=next_pow2(n_splits, 2), KP=sh["kp"], CAP=sh["cap"],
                                          BLOCK=sh["block"], SUB_LSE=sub_lse, TOKEN_SHIFT=TOKEN_BITS,
                                          num_warps=8)
        launch_exact(x, k, vals, ids, lse, sub_lse=sub_lse, flag=flag)  # overflowed rows only
    out = (vals.view(*lead, k), ids.view(*lead, k), lse.view(lead))
    return out + (flag.view(lead),) if return_overflow else out


def draft_topk_select(draft_logits: torch.Tensor, k: int, **plan_overrides) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, V] -> (log-probs fp32 [B, L, k], tokens int64 [B, L, k]), the order of :mod:`.topk_ref`."""
    lp, tok, _ = topk_logits_lse(draft_logits, k, **plan_overrides)
    return lp, tok
