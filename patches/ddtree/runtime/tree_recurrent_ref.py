"""Recurrent-state branching in plain torch: argument checks and the references of the three steps.

Layouts, recurrence and what is kept are described in :mod:`.tree_recurrent` (the public entries); the Triton
kernels in :mod:`.tree_recurrent_triton` share the checks here.
"""
from __future__ import annotations

import torch

MAX_TREE_NODES = 1025  # budget <= 1024 plus the root, as in the rest of the runtime


# ----------------------------------------------------------------------------------------------- validation


def check_parent_order(parent: torch.Tensor) -> None:
    """Raise ValueError unless every ``parent[b, i]`` is -1 or in ``[0, i)``. Synchronises (tests, debugging)."""
    if parent.dim() != 2:
        raise ValueError("parent must be [B, N1]")
    idx = torch.arange(parent.shape[1], device=parent.device)
    bad = (parent < -1) | (parent >= idx)
    if bool(bad.any()):
        b, i = (int(t) for t in bad.nonzero()[0])
        raise ValueError(f"parent[{b}, {i}] = {int(parent[b, i])}: parents must precede children (or be -1)")


def _check_tree_batch(parent, cache_slot, batch: int, n1: int) -> None:
    """The arguments every recurrent step shares: the tree ``parent`` [B, N1] and each request's ``cache_slot``."""
    if parent.shape != (batch, n1):
        raise ValueError(f"parent must be [B={batch}, N1={n1}]")
    if not 1 <= n1 <= MAX_TREE_NODES:
        raise ValueError(f"N1 must be in [1, {MAX_TREE_NODES}]")
    if cache_slot.shape != (batch,):
        raise ValueError(f"cache_slot must be [B={batch}]")


def _check_conv_args(x, parent, conv_state, cache_slot, weight, bias):
    if x.dim() != 3:
        raise ValueError("x must be [B, N1, D]")
    batch, n1, dim = x.shape
    _check_tree_batch(parent, cache_slot, batch, n1)
    if weight.dim() != 2 or weight.shape[0] != dim or weight.shape[1] < 2:
        raise ValueError(f"weight must be [D={dim}, K_conv >= 2]")
    k_conv = weight.shape[1]
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or conv_state.shape[2] < k_conv - 1:
        raise ValueError(f"conv_state must be [slots, D={dim}, state_len >= {k_conv - 1}]")
    if bias is not None and bias.shape != (dim,):
        raise ValueError(f"bias must be [D={dim}]")
    return batch, n1, dim, k_conv


def _check_gdn_args(q, k, v, g, beta, parent, ssm_state, cache_slot):
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError("q and k must both be [B, N1, H, K]")
    batch, n1, heads, kdim = q.shape
    if v.dim() != 4 or v.shape[:2] != (batch, n1):
        raise ValueError("v must be [B, N1, HV, V]")
    hv, vdim = v.shape[2], v.shape[3]
    if hv % heads:
        raise ValueError(f"HV={hv} must be a multiple of H={heads}")
    if g.shape != (batch, n1, hv) or beta.shape != (batch, n1, hv):
        raise ValueError(f"g and beta must be [B={batch}, N1={n1}, HV={hv}]")
    _check_tree_batch(parent, cache_slot, batch, n1)
    if ssm_state.dim() != 4 or tuple(ssm_state.shape[1:]) != (hv, vdim, kdim):
        raise ValueError(f"ssm_state must be [slots, HV={hv}, V={vdim}, K={kdim}]")
    return batch, n1, heads, hv, kdim, vdim


# ------------------------------------------------------------------------------------------ torch references


def _gather_rows(pool: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """pool[slot] with zeros where slot < 0 (padded requests)."""
    ok = slot >= 0
    rows = pool[slot.clamp(min=0).long()]
    return rows * ok.view(-1, *([1] * (rows.dim() - 1))).to(rows.dtype)


def qk_per_value_head(q, k, hv: int, cdt, l2norm: bool, scale: float):
    """q, k [B, N1, H, K] -> [B, N1, HV, K] in ``cdt``: repeated per value head, optionally l2-normalised
    (``x / sqrt(sum x^2 + 1e-6)``), q times ``scale``. Shared by the recurrent and the chunk references."""
    rep = hv // q.shape[2]
    qf = q.to(cdt).repeat_interleave(rep, dim=2)
    kf = k.to(cdt).repeat_interleave(rep, dim=2)
    if l2norm:
        qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    return qf * scale, kf


def tree_causal_conv1d_torch(x, parent, conv_state, cache_slot, weight, bias=None, activation=None,
                             node_conv=None):
    """Reference for :func:`tree_causal_conv1d`: per node, walk K_conv-1 ancestors (vectorised over B, N1)."""
    batch, n1, dim, k_conv = _check_conv_args(x, parent, conv_state, cache_slot, weight, bias)
    w = k_conv - 1
    cdt = torch.promote_types(x.dtype, torch.float32)
    state = _gather_rows(conv_state[:, :, :w], cache_slot).to(cdt)  # [B, D, w], oldest first
    xs = x.to(cdt)
    bidx = torch.arange(batch, device=x.device)[:, None].expand(batch, n1)
    cur = torch.arange(n1, device=x.device)[None, :].expand(batch, n1).long()
    back = torch.zeros(batch, n1, dtype=torch.long, device=x.device)
    par = parent.long()
    vals = []  # newest first: vals[j] = input j steps back along the path, [B, N1, D]
    for _ in range(k_conv):
        is_node = cur >= 0
        from_x = xs[bidx, cur.clamp(min=0)]
        col = (w - 1 - back).clamp(min=0)
        from_state = state.transpose(1, 2)[bidx, col]  # [B, N1, D]
        vals.append(torch.where(is_node[..., None], from_x, from_state))
        nxt = torch.gather(par, 1, cur.clamp(min=0))
        back = back + (~is_node).long()
        cur = torch.where(is_node, nxt, torch.full_like(cur, -1))
    acc = sum(vals[j] * weight[:, k_conv - 1 - j].to(cdt) for j in range(k_conv))
    if bias is not None:
        acc = acc + bias.to(cdt)
    if activation in ("silu", "swish", True):
        acc = acc * torch.sigmoid(acc)
    win = torch.stack([vals[w - 1 - c] for c in range(w)], dim=-1)  # [B, N1, D, w], oldest first
    if node_conv is None:
        node_conv = torch.empty(batch, n1, dim, w, dtype=conv_state.dtype, device=x.device)
    node_conv.copy_(win)
    return acc.to(x.dtype), node_conv


def tree_gated_delta_rule_torch(q, k, v, g, beta, parent, ssm_state, cache_slot, scale=None,
                                use_qk_l2norm=False, node_ssm=None, state_dtype=None):
    """Reference for :func:`tree_gated_delta_rule`: one loop over node index, vectorised over B and heads."""
    batch, n1, heads, hv, kdim, vdim = _check_gdn_args(q, k, v, g, beta, parent, ssm_state, cache_slot)
    if scale is None:
        scale = kdim ** -0.5
    cdt = torch.promote_types(q.dtype, torch.float32)
    sdt = state_dtype or ssm_state.dtype
    if node_ssm is None:
        node_ssm = torch.empty(batch, n1, hv, vdim, kdim, dtype=sdt, device=q.device)
    qf, kf = qk_per_value_head(q, k, hv, cdt, use_qk_l2norm, scale)
    vf, gf, bf = v.to(cdt), g.to(cdt), beta.to(cdt)
    h0 = _gather_rows(ssm_state, cache_slot).to(cdt)  # [B, HV, V, K]
    out = torch.empty(batch, n1, hv, vdim, dtype=q.dtype, device=q.device)
    bidx = torch.arange(batch, device=q.device)
    par = parent.long()
    for i in range(n1):
        p = par[:, i]
        from_parent = node_ssm[bidx, p.clamp(min=0)].to(cdt)
        h = torch.where((p >= 0).view(-1, 1, 1, 1), from_parent, h0)
        h = h * torch.exp(gf[:, i])[..., None, None]
        kv = (h * kf[:, i, :, None, :]).sum(-1)  # [B, HV, V]
        vn = (vf[:, i] - kv) * bf[:, i][..., None]
        h = h + vn[..., :, None] * kf[:, i, :, None, :]
        out[:, i] = (h * qf[:, i, :, None, :]).sum(-1).to(q.dtype)
        node_ssm[:, i] = h.to(node_ssm.dtype)
    return out, node_ssm


def commit_tree_states_torch(ssm_state, conv_state, node_ssm, node_conv, accepted_last_node, cache_slot):
    """Reference for :func:`commit_tree_states` (in place; skips requests with a negative slot or node)."""
    w = node_conv.shape[-1]
    # the reference may synchronise (it is the CPU path); the Triton kernel does not
    keep = ((cache_slot >= 0) & (accepted_last_node >= 0)).nonzero().flatten()
    a = accepted_last_node[keep].long()
    s = cache_slot[keep].long()
    ssm_state[s] = node_ssm[keep, a].to(ssm_state.dtype)
    conv_state[s, :, :w] = node_conv[keep, a].to(conv_state.dtype)
    return ssm_state, conv_state



def commit_tree_states_layers_torch(ssm_pools, conv_pools, node_ssm, node_conv, accepted_last_node, cache_slot):
    """Reference for :func:`commit_tree_states_layers`: the single-layer commit, layer by layer."""
    batch = accepted_last_node.shape[0]
    for layer in range(node_ssm.shape[0]):
        commit_tree_states_torch(ssm_pools[layer], conv_pools[layer], node_ssm[layer, :batch],
                                 node_conv[layer, :batch], accepted_last_node, cache_slot)
    return ssm_pools, conv_pools

# --------------------------------------------------------------------------------------------- public API
