"""DDTree (diffusion draft tree) verification for the spec-v1 DFlash worker.

DDTree keeps the DFlash drafter: one non-causal draft forward over
`[root, MASK x L]` gives draft logits for depths 1..L. Instead of the greedy
chain, DDTree takes per-depth top-k log-probs, builds the best `budget` nodes as
a prefix-closed tree (the runtime's `build_tree`), verifies all `budget + 1`
nodes in one target forward with a tree attention mask and depth positions, and
walks the tree with one target token per node (argmax, or one independent draw
from the request's sampling distribution: lossless).

The algorithmic pieces (top-k, tree build, verify inputs, walk) come from the
vendored DDTree runtime `sglang.srt.speculative.ddtree`; this module adapts them
to SGLang's batch, KV and attention-backend layout.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

logger = logging.getLogger(__name__)

_RUNTIME = None


def ddtree_runtime():
    """The vendored DDTree runtime package (imported lazily: torch + triton only)."""
    global _RUNTIME
    if _RUNTIME is None:
        from sglang.srt.speculative import ddtree as _rt

        _RUNTIME = _rt
    return _RUNTIME


def _local_vocab_logits(
    hs: torch.Tensor, lm_head
) -> Tuple[torch.Tensor, Optional[torch.Tensor], int]:
    """fp32 logits over this rank's vocab shard (base vocab, then added vocab).

    Returns (logits [n, local_v], local->global id map or None, org_vocab_start).
    Padding rows of the shard are never included.
    """
    shard = lm_head.shard_indices
    weight = lm_head.weight
    if hs.dtype != weight.dtype:
        hs = hs.to(weight.dtype)
    num_org = int(shard.num_org_elements)
    num_org_padded = int(shard.num_org_elements_padded)
    num_added = int(shard.num_added_elements)
    org_start = int(shard.org_vocab_start_index)
    added_start = int(shard.added_vocab_start_index)
    logits = torch.matmul(hs, weight[:num_org].T).float()
    if num_added == 0:
        return logits, None, org_start
    added = torch.matmul(hs, weight[num_org_padded : num_org_padded + num_added].T)
    logits = torch.cat([logits, added.float()], dim=-1)
    id_map = torch.cat(
        [
            torch.arange(num_org, device=hs.device, dtype=torch.int64) + org_start,
            torch.arange(num_added, device=hs.device, dtype=torch.int64) + added_start,
        ]
    )
    return logits, id_map, org_start


def ddtree_draft_topk(
    hidden_states: torch.Tensor,
    lm_head,
    k: int,
    *,
    tp_group=None,
    chunk_size: int = 256,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-position top-k draft log-probs over the (TP-sharded) target LM head.

    hidden_states: [n, hidden]. Returns (logprobs fp32 [n, k], token ids int64 [n, k]),
    sorted by descending log-prob. Log-probs are normalised over the whole vocab.

    TP: each rank takes the top-k of its own vocab shard and its shard's logsumexp;
    only those (k values, k ids, 1 normaliser per position and rank) are gathered,
    never full-vocab logits. The global top-k is taken over the tp * k candidates.
    """
    rt = ddtree_runtime()
    n = int(hidden_states.shape[0])
    device = hidden_states.device
    out_lp = torch.empty((n, k), dtype=torch.float32, device=device)
    out_tok = torch.empty((n, k), dtype=torch.int64, device=device)
    if n == 0:
        return out_lp, out_tok
    tp_size = 1 if tp_group is None else int(tp_group.world_size)

    for start in range(0, n, int(chunk_size)):
        end = min(n, start + int(chunk_size))
        logits, id_map, org_start = _local_vocab_logits(hidden_states[start:end], lm_head)
        m = end - start
        if tp_size == 1:
            kk = min(k, int(logits.shape[-1]))
            lp, idx = rt.draft_topk(logits.unsqueeze(0), kk)
            lp, idx = lp[0], idx[0]
            tok = id_map[idx] if id_map is not None else idx + org_start
            out_lp[start:end, :kk] = lp
            out_tok[start:end, :kk] = tok
            if kk < k:  # only when k > vocab; the caller caps k at the vocab size
                out_lp[start:end, kk:] = float("-inf")
                out_tok[start:end, kk:] = 0
            continue

        local_v = int(logits.shape[-1])
        kk = min(k, local_v)
        local_lse = torch.logsumexp(logits, dim=-1)  # [m]
        vals, idx = torch.topk(logits, kk, dim=-1)  # [m, kk]
        gids = id_map[idx] if id_map is not None else idx + org_start
        g_vals = torch.empty((tp_size * m * kk,), dtype=torch.float32, device=device)
        g_ids = torch.empty((tp_size * m * kk,), dtype=torch.int64, device=device)
        g_lse = torch.empty((tp_size * m,), dtype=torch.float32, device=device)
        tp_group.all_gather_into_tensor(g_vals, vals.contiguous().view(-1))
        tp_group.all_gather_into_tensor(g_ids, gids.contiguous().view(-1))
        tp_group.all_gather_into_tensor(g_lse, local_lse.contiguous())
        lse = torch.logsumexp(g_lse.view(tp_size, m), dim=0)  # [m]
        cand_vals = g_vals.view(tp_size, m, kk).permute(1, 0, 2).reshape(m, tp_size * kk)
        cand_ids = g_ids.view(tp_size, m, kk).permute(1, 0, 2).reshape(m, tp_size * kk)
        kg = min(k, tp_size * kk)
        # Deterministic order: descending value, ties by ascending token id.
        order = torch.argsort(cand_ids, dim=-1)
        cand_vals = cand_vals.gather(1, order)
        cand_ids = cand_ids.gather(1, order)
        top_vals, top_pos = torch.sort(cand_vals, dim=-1, descending=True, stable=True)
        top_vals, top_pos = top_vals[:, :kg], top_pos[:, :kg]
        out_lp[start:end, :kg] = top_vals - lse[:, None]
        out_tok[start:end, :kg] = cand_ids.gather(1, top_pos)
        if kg < k:
            out_lp[start:end, kg:] = float("-inf")
            out_tok[start:end, kg:] = 0
    return out_lp, out_tok


def expand_tree_mask_torch(
    tree_mask: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_sum: int
) -> torch.Tensor:
    """Flattened triton-backend verify mask from the per-request tree mask.

    tree_mask: bool [B, N1, N1] (row i sees column j iff j is i or an ancestor of i).
    prefix_lens: [B] committed lengths on the device; prefix_lens_sum: their sum on the host.
    Returns bool [sum_b N1 * (prefix_b + N1)]: per request a row-major [N1, prefix_b + N1]
    block whose prefix columns are all visible (SGLang's custom_mask / mask_indptr layout).
    Vectorised: no per-request loop and no host synchronisation.
    """
    bs, n1, _ = tree_mask.shape
    device = tree_mask.device
    total = n1 * (int(prefix_lens_sum) + bs * n1)
    prefix = prefix_lens.to(torch.int64)
    row_len = prefix + n1
    seg = row_len * n1
    indptr = torch.cumsum(seg, dim=0)
    idx = torch.arange(total, device=device, dtype=torch.int64)
    req = torch.searchsorted(indptr, idx, right=True)
    local = idx - (indptr[req] - seg[req])
    rl = row_len[req]
    row = local // rl
    col = local - row * rl - prefix[req]
    vis = tree_mask[req, row, col.clamp(min=0)]
    return vis | (col < 0)


_EXPAND_KERNEL = None


def _get_expand_kernel():
    """Triton kernel: one program per (request, tree row) writes its mask row."""
    global _EXPAND_KERNEL
    if _EXPAND_KERNEL is not None:
        return _EXPAND_KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def _ddtree_expand_mask_kernel(
        tree_mask_ptr,  # uint8 [B, N1, N1]
        prefix_ptr,  # int64 [B]
        row_start_ptr,  # int64 [B]: start of request b's block in the flat mask
        out_ptr,  # int8 view of the bool [total] output
        N1: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # grid = (B, N1, cdiv(max_prefix + N1, BLOCK)): one BLOCK-wide chunk of one row.
        b = tl.program_id(0)
        i = tl.program_id(1)
        c = tl.program_id(2)
        prefix = tl.load(prefix_ptr + b)
        row_len = prefix + N1
        base = tl.load(row_start_ptr + b) + i.to(tl.int64) * row_len
        cols = c * BLOCK + tl.arange(0, BLOCK)
        in_row = cols < row_len
        tcol = cols - prefix
        is_tree = in_row & (tcol >= 0)
        v = tl.load(
            tree_mask_ptr + (b.to(tl.int64) * N1 + i) * N1 + tcol,
            mask=is_tree,
            other=1,
        )
        v = tl.where(is_tree, v, 1)
        tl.store(out_ptr + base + cols, v.to(tl.int8), mask=in_row)

    _EXPAND_KERNEL = _ddtree_expand_mask_kernel
    return _EXPAND_KERNEL


def expand_tree_mask_triton(
    tree_mask: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: int,
    max_prefix_len: Optional[int] = None,
) -> torch.Tensor:
    """Same result as `expand_tree_mask_torch`, one Triton launch, no host sync."""
    import triton

    bs, n1, _ = tree_mask.shape
    device = tree_mask.device
    total = n1 * (int(prefix_lens_sum) + bs * n1)
    out = torch.empty((total,), dtype=torch.bool, device=device)
    if total == 0 or bs == 0:
        return out
    prefix = prefix_lens.to(torch.int64).contiguous()
    seg = (prefix + n1) * n1
    row_start = torch.cumsum(seg, dim=0) - seg
    tm = tree_mask.contiguous().view(torch.uint8)
    kernel = _get_expand_kernel()
    if max_prefix_len is None:  # host value; pass it to avoid a device sync
        max_prefix_len = int(prefix_lens_sum)
    block = 256
    grid = (bs, n1, triton.cdiv(int(max_prefix_len) + n1, block))
    kernel[grid](tm, prefix, row_start, out.view(torch.int8), N1=n1, BLOCK=block)
    return out


def _triton_usable(t: torch.Tensor) -> bool:
    if not t.is_cuda:
        return False
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def build_ddtree_verify_mask(
    tree_mask: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: int,
    max_prefix_len: Optional[int] = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Flattened triton-backend verify mask; impl = "triton" | "torch" | "auto"."""
    if impl == "triton" or (impl == "auto" and _triton_usable(tree_mask)):
        return expand_tree_mask_triton(
            tree_mask, prefix_lens, prefix_lens_sum, max_prefix_len
        )
    return expand_tree_mask_torch(tree_mask, prefix_lens, prefix_lens_sum)


def sample_target_tokens_per_node(
    logits: torch.Tensor, sampling_info, bs: int, n1: int
) -> torch.Tensor:
    """One target token per tree node: int64 [bs, n1].

    Greedy requests take the argmax. Otherwise each node gets one independent draw
    from the request's own sampling distribution (temperature, then top-k / top-p /
    min-p exactly as SGLang's torch sampler applies them), which makes every committed
    token an exact target sample at its ancestor context (lossless).
    """
    if sampling_info is None or sampling_info.is_all_greedy:
        return torch.argmax(logits, dim=-1).view(bs, n1)
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    temps = sampling_info.temperatures.view(-1, 1).to(torch.float32)
    temps = torch.repeat_interleave(temps, n1, dim=0)
    probs = torch.softmax(logits.float() / temps, dim=-1)
    top_ks = torch.repeat_interleave(sampling_info.top_ks.view(-1), n1, dim=0)
    top_ps = torch.repeat_interleave(sampling_info.top_ps.view(-1), n1, dim=0)
    min_ps = torch.repeat_interleave(sampling_info.min_ps.view(-1), n1, dim=0)
    ids = top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        top_ks,
        top_ps,
        min_ps,
        sampling_info.need_min_p_sampling,
        None,
        None,
    )
    return ids.to(torch.int64).view(bs, n1)


def accepted_kv_and_hidden_index(
    accepted_nodes: torch.Tensor, commit_lens: torch.Tensor, n1: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index helpers for the accepted path.

    accepted_nodes: int [bs, L+1] (node 0 = root first, -1 padding); commit_lens: int [bs]
    (committed verify nodes per request, <= accept_len + 1).
    Returns:
      keep_flat: int64 [sum(commit_lens)] flat verify slots (b * n1 + node) of the kept
        nodes, request by request in path order;
      keep_node_mask: bool [bs, n1], True for kept nodes;
      path_mask: bool [bs, L+1], True for the first commit_lens entries.
    """
    bs, lp1 = accepted_nodes.shape
    device = accepted_nodes.device
    nodes = accepted_nodes.to(torch.int64)
    path_mask = torch.arange(lp1, device=device)[None, :] < commit_lens.to(device)[:, None]
    path_mask &= nodes >= 0
    safe = torch.where(path_mask, nodes, torch.full_like(nodes, n1))
    keep = torch.zeros((bs, n1 + 1), dtype=torch.bool, device=device)
    keep.scatter_(1, safe, True)
    keep_node_mask = keep[:, :n1]
    flat = torch.arange(bs, device=device, dtype=torch.int64)[:, None] * n1 + safe
    keep_flat = flat[path_mask]
    return keep_flat, keep_node_mask, path_mask
