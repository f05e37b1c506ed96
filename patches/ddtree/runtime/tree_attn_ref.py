"""Tree-verify attention in plain torch: the reference for :mod:`.tree_attn_triton`.

One verify forward of the target attends, per request ``b`` and query head, each of its ``n_b`` verified tokens
(the tree's nodes, ``qo_indptr`` gives where they sit in the flat batch) to

* every token of the committed context (``prefix_b`` KV slots, ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` into the
  pool ``k_buf`` / ``v_buf``), all visible, and
* the verified tokens themselves (``k_ext`` / ``v_ext``, the same flat rows as ``q``) where the tree mask says so:
  the mask is SGLang's flat per-request layout (:mod:`.mask_ref`): request ``b``'s block starts at
  ``mask_indptr[b]``, row ``i`` at ``+ i * (prefix_b + n_b)``, and token ``j``'s column at ``+ prefix_b + j``.
  The context columns of the mask are never read (DDTree does not write them).

Grouped-query attention: query head ``h`` reads KV head ``h // (Hq // Hkv)``. Softmax in float32, output in the
dtype of ``o``. This is the same attention SGLang's triton extend kernel computes for a custom mask with its prefix
part skipped; the kernel beside it only computes it differently (all query heads of a KV head at once, the context
split across programs).
"""
from __future__ import annotations

import torch


def tree_verify_attention_torch(q: torch.Tensor, k_ext: torch.Tensor, v_ext: torch.Tensor, o: torch.Tensor,
                                k_buf: torch.Tensor, v_buf: torch.Tensor, qo_indptr: torch.Tensor,
                                kv_indptr: torch.Tensor, kv_indices: torch.Tensor, mask: torch.Tensor,
                                mask_indptr: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """Write the attention of every verified token into ``o`` ([T, Hq, Dv]) and return it.

    ``q`` [T, Hq, D]; ``k_ext`` [T, Hkv, D], ``v_ext`` [T, Hkv, Dv]; ``k_buf`` [slots, Hkv, D], ``v_buf`` [slots,
    Hkv, Dv]; ``qo_indptr``, ``kv_indptr``, ``mask_indptr`` int [B + 1]; ``kv_indices`` int [>= kv_indptr[B]];
    ``mask`` flat bool or uint8. Reads the index arrays on the host (a reference, not for a CUDA graph).
    """
    hq, hkv = int(q.shape[1]), int(k_ext.shape[1])
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    group = hq // hkv
    qo = qo_indptr.to("cpu", torch.int64).tolist()
    kv = kv_indptr.to("cpu", torch.int64).tolist()
    mk = mask_indptr.to("cpu", torch.int64).tolist()
    flat = mask.view(-1)
    for b in range(len(qo) - 1):
        n = qo[b + 1] - qo[b]
        if n == 0:
            continue
        prefix = kv[b + 1] - kv[b]
        slots = kv_indices[kv[b]: kv[b + 1]].to(torch.int64)
        keys = torch.cat([k_buf[slots], k_ext[qo[b]: qo[b + 1]]], 0).float()  # [prefix + n, Hkv, D]
        vals = torch.cat([v_buf[slots], v_ext[qo[b]: qo[b + 1]]], 0).float()
        rows = mk[b] + torch.arange(n, dtype=torch.int64)[:, None] * (prefix + n)
        tree = flat[(rows + prefix + torch.arange(n, dtype=torch.int64)[None, :]).to(flat.device)] != 0  # [n, n]
        visible = torch.cat([torch.ones((n, prefix), dtype=torch.bool, device=tree.device), tree], 1)
        qs = q[qo[b]: qo[b + 1]].float()  # [n, Hq, D]
        keys = keys.repeat_interleave(group, dim=1)  # [L, Hq, D]
        vals = vals.repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", qs, keys) * sm_scale
        scores = scores.masked_fill(~visible.to(scores.device)[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # a row that sees nothing (never in a tree: a node sees itself)
        o[qo[b]: qo[b + 1]] = torch.einsum("hnl,lhd->nhd", probs, vals).to(o.dtype)
    return o
