"""Tree-verify attention in Triton: every query head of a KV head at once, the context split across programs.

What differs from SGLang's triton extend kernel, which computes the same attention (reference:
:mod:`.tree_attn_ref`):

* **Grouped heads in one tile.** A verify has few tokens per request (the tree's N1 = budget + 1), so one query
  head's rows fill an eighth of a 128-row tile. Here a program takes the rows of ``HG`` of the ``G = Hq / Hkv`` query
  heads that read one KV head (row ``r`` = head ``r // N`` of the program's ``HG``, token ``r % N``; as many heads as
  fit, the rest in further row blocks), so each context tile is loaded once per KV head (per row block) instead of
  once per query head, and the tensor-core tiles are mostly real rows.
* **No register spills.** Tile sizes chosen by compiling for sm_90a and reading ptxas's report (no GPU needed):
  128 x 32 tiles and 8 warps at head dim 128, 64 x 16 at 256; SGLang's extend kernel at the same shapes spills
  348 bytes per thread (causal) and 976 (with a custom mask) at head dim 128, about 2.5 KB at 256
  (``tests/runtime/test_tree_attn_compile.py``).
* **The context split across programs** (flash-decoding): with few requests the grid would be a few programs each
  walking the whole context; ``splits`` programs per (request, KV head, row block) each take a slice and a second
  kernel merges their partial results by log-sum-exp. Chosen per batch size, so it is fixed inside a CUDA graph;
  the slices are cut from the context length on the device.
* **The tree block only reads the mask**; the context is visible to every node, so its columns need no mask.

Sync-free and capturable: sizes come from the device index arrays; ``max_len`` (the verify width) is the host's.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2


@triton.jit
def _tree_attn_kernel(Q, K_ext, V_ext, K_buf, V_buf, Out, O_part, L_part,
                      qo_indptr, kv_indptr, kv_indices, mask_ptr, mask_indptr, sm_scale,
                      s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_kbs, s_kbh, s_vbs, s_vbh, s_ot, s_oh,
                      s_ps, s_pt, s_ph, s_ls, s_lt,
                      G: tl.constexpr, N: tl.constexpr, HG: tl.constexpr, RB: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // RB
    rb = tl.program_id(1) % RB
    split = tl.program_id(2)

    qo_start = tl.load(qo_indptr + b).to(tl.int64)
    n_b = tl.load(qo_indptr + b + 1).to(tl.int64) - qo_start
    kv_start = tl.load(kv_indptr + b).to(tl.int64)
    prefix = tl.load(kv_indptr + b + 1).to(tl.int64) - kv_start

    r = tl.arange(0, BLOCK_M)  # rows: HG heads of the group (this row block's), N tokens each
    hl = r // N
    g = rb * HG + hl
    i = (r % N).to(tl.int64)
    row_ok = (hl < HG) & (g < G) & (i < n_b)
    head = kvh * G + g
    t = qo_start + i
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    q = tl.load(Q + t[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    deno = tl.zeros([BLOCK_M], dtype=tl.float32)
    e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    offs_n = tl.arange(0, BLOCK_N)

    # the context: this split's slice, all of it visible
    per = tl.cdiv(tl.cdiv(prefix, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per
    hi = tl.minimum(lo + per, prefix)
    # (while loops: the bounds are loaded values, which the interpreter holds as one-element arrays that Python's
    # range refuses)
    start = 0
    while start < per:
        cols = lo + start + offs_n
        col_ok = cols < hi
        loc = tl.load(kv_indices + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
        k = tl.load(K_buf + loc[None, :] * s_kbs + kvh * s_kbh + offs_d[:, None],
                    mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        qk = tl.dot(q.to(k.dtype), k) * sm_scale
        qk = tl.where(row_ok[:, None] & col_ok[None, :], qk, float("-inf"))
        row_max = tl.max(qk, 1)
        n_max = tl.maximum(tl.where(row_max == float("-inf"), -1e20, row_max), e_max)
        re_scale = tl.exp(e_max - n_max)
        prob = tl.exp(qk - n_max[:, None])
        deno = deno * re_scale + tl.sum(prob, 1)
        v = tl.load(V_buf + loc[:, None] * s_vbs + kvh * s_vbh + offs_dv[None, :],
                    mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        acc = acc * re_scale[:, None] + tl.dot(prob.to(v.dtype), v)
        e_max = n_max
        start += BLOCK_N

    # the tree block (the last split): the verified tokens, where the ancestor mask says so
    if split == SPLITS - 1:
        row_len = prefix + n_b
        mask_row = tl.load(mask_indptr + b).to(tl.int64) + i * row_len + prefix
        start = 0
        while start < n_b:
            cols = start + offs_n
            col_ok = cols < n_b
            seen = tl.load(mask_ptr + mask_row[:, None] + cols[None, :],
                           mask=row_ok[:, None] & col_ok[None, :], other=0)
            k = tl.load(K_ext + (qo_start + cols)[None, :] * s_kt + kvh * s_kh + offs_d[:, None],
                        mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            qk = tl.dot(q.to(k.dtype), k) * sm_scale
            qk = tl.where(row_ok[:, None] & col_ok[None, :] & (seen != 0), qk, float("-inf"))
            row_max = tl.max(qk, 1)
            n_max = tl.maximum(tl.where(row_max == float("-inf"), -1e20, row_max), e_max)
            re_scale = tl.exp(e_max - n_max)
            prob = tl.exp(qk - n_max[:, None])
            deno = deno * re_scale + tl.sum(prob, 1)
            v = tl.load(V_ext + (qo_start + cols)[:, None] * s_vt + kvh * s_vh + offs_dv[None, :],
                        mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
            acc = acc * re_scale[:, None] + tl.dot(prob.to(v.dtype), v)
            e_max = n_max
            start += BLOCK_N

    safe = tl.where(deno > 0, deno, 1.0)
    out = acc / safe[:, None]
    if SPLITS == 1:
        tl.store(Out + t[:, None] * s_ot + head[:, None] * s_oh + offs_dv[None, :], out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & dv_ok[None, :])
    else:
        tl.store(O_part + split * s_ps + t[:, None] * s_pt + head[:, None] * s_ph + offs_dv[None, :], out,
                 mask=row_ok[:, None] & dv_ok[None, :])
        lse = tl.where(deno > 0, e_max + tl.log(safe), float("-inf"))
        tl.store(L_part + split * s_ls + t * s_lt + head, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(Out, O_part, L_part, s_ot, s_oh, s_ps, s_pt, s_ph, s_ls, s_lt,
                         DV: tl.constexpr, BLOCK_DV: tl.constexpr, SPLITS: tl.constexpr,
                         BLOCK_S: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    s_ok = offs_s < SPLITS
    lse = tl.load(L_part + offs_s * s_ls + t * s_lt + h, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp(lse - top)
    w = tl.where(s_ok, w, 0.0)
    part = tl.load(O_part + offs_s[:, None] * s_ps + t * s_pt + h * s_ph + offs_dv[None, :],
                   mask=s_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(Out + t * s_ot + h * s_oh + offs_dv, out.to(Out.dtype.element_ty), mask=offs_dv < DV)


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _overrides() -> dict[str, int]:
    """``DDTREE_TREE_ATTN=bm=64,bn=64,warps=4,stages=1,splits=4``: launch settings for tuning (default: none)."""
    text = os.environ.get("DDTREE_TREE_ATTN", "")
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = part.partition("=")
        if key not in ("bm", "bn", "warps", "stages", "splits") or not val.isdigit():
            raise ValueError(f"DDTREE_TREE_ATTN: {part!r} is not one of bm=, bn=, warps=, stages=, splits= "
                             "with a whole number")
        out[key] = int(val)
    return out


def plan(batch: int, q_heads: int, kv_heads: int, head_dim: int, max_len: int, device: torch.device,
         splits: int | None = None) -> dict[str, int]:
    """The launch settings for one shape: tile sizes, warps, and how many programs share each context."""
    ov = _overrides()
    group = q_heads // kv_heads
    block_d = next_pow2(head_dim)
    block_m = ov.get("bm", min(next_pow2(group * max_len), 128 if block_d <= 128 else 64))
    block_m = max(block_m, next_pow2(max_len))  # a row block holds at least one head's tokens
    block_n = ov.get("bn", 32 if block_d <= 128 else 16)
    heads = min(group, block_m // max_len)  # query heads per row block (a program's rows: heads x tokens)
    row_blocks = -(-group // heads)
    if splits is None:
        splits = ov.get("splits")
    if splits is None:
        if device.type == "cuda":
            splits = max(1, min(16, (2 * _sm_count(device.index or 0)) // max(1, batch * kv_heads * row_blocks)))
        else:
            splits = 1
    warps = ov.get("warps", 8 if block_m * block_d >= 128 * 64 else 4)
    return dict(block_m=block_m, block_n=block_n, heads=heads, row_blocks=row_blocks, splits=int(splits), warps=warps,
                stages=ov.get("stages", 1), block_d=block_d)


def tree_verify_attention_triton(q: torch.Tensor, k_ext: torch.Tensor, v_ext: torch.Tensor, o: torch.Tensor,
                                 k_buf: torch.Tensor, v_buf: torch.Tensor, qo_indptr: torch.Tensor,
                                 kv_indptr: torch.Tensor, kv_indices: torch.Tensor, mask: torch.Tensor,
                                 mask_indptr: torch.Tensor, sm_scale: float, max_len: int,
                                 splits: int | None = None) -> torch.Tensor:
    """See :func:`.tree_attn_ref.tree_verify_attention_torch`; ``max_len`` bounds every request's token count."""
    batch = int(qo_indptr.shape[0]) - 1
    tokens, hq, dim = (int(s) for s in q.shape)
    hkv, dv = int(k_ext.shape[1]), int(v_ext.shape[-1])
    if batch <= 0 or tokens == 0:
        return o
    cfg = plan(batch, hq, hkv, dim, int(max_len), q.device, splits)
    s = cfg["splits"]
    if s > 1:
        o_part = torch.empty((s, tokens, hq, dv), dtype=torch.float32, device=q.device)
        l_part = torch.empty((s, tokens, hq), dtype=torch.float32, device=q.device)
    else:
        o_part = l_part = o  # not written
    mask_flat = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    grid = (batch, hkv * cfg["row_blocks"], s)
    _tree_attn_kernel[grid](
        q, k_ext, v_ext, k_buf, v_buf, o, o_part, l_part,
        qo_indptr, kv_indptr, kv_indices, mask_flat, mask_indptr, float(sm_scale),
        q.stride(0), q.stride(1), k_ext.stride(0), k_ext.stride(1), v_ext.stride(0), v_ext.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), o.stride(0), o.stride(1),
        o_part.stride(0) if s > 1 else 0, o_part.stride(1) if s > 1 else 0, o_part.stride(2) if s > 1 else 0,
        l_part.stride(0) if s > 1 else 0, l_part.stride(1) if s > 1 else 0,
        G=hq // hkv, N=int(max_len), HG=cfg["heads"], RB=cfg["row_blocks"], D=dim, DV=dv, BLOCK_D=cfg["block_d"],
        BLOCK_DV=next_pow2(dv), BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], SPLITS=s,
        num_warps=cfg["warps"], num_stages=cfg["stages"])
    if s > 1:
        _merge_splits_kernel[(tokens, hq)](
            o, o_part, l_part, o.stride(0), o.stride(1), o_part.stride(0), o_part.stride(1), o_part.stride(2),
            l_part.stride(0), l_part.stride(1), DV=dv, BLOCK_DV=next_pow2(dv), SPLITS=s,
            BLOCK_S=next_pow2(s, 2), num_warps=4)
    return o
