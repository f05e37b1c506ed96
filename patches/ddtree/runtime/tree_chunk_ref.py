"""The tree gated delta rule in chunk form, in plain torch: argument checks and the references of its three steps
(semantics in :mod:`.tree_chunk`; the Triton kernels in :mod:`.tree_chunk_triton` share the checks here)."""
from __future__ import annotations

import torch

from .tree_recurrent_ref import MAX_TREE_NODES, _check_gdn_args, _gather_rows, qk_per_value_head


def record_width(kdim: int, vdim: int) -> int:
    """Floats one node keeps per value head: its delta u (V), its normalised key (K) and its path log decay."""
    return int(vdim) + int(kdim) + 1


def _check_anc(anc: torch.Tensor, batch: int, n1: int) -> None:
    if anc.shape != (batch, n1, n1):
        raise ValueError(f"anc must be [B={batch}, N1={n1}, N1={n1}] (tree_ancestors of the parents)")


def _check_records(records: torch.Tensor, batch: int, n1: int, hv: int, width: int) -> None:
    if (records.dim() != 4 or records.shape[0] < batch or tuple(records.shape[1:]) != (n1, hv, width)
            or records.dtype != torch.float32 or not records[:batch].is_contiguous()):
        raise ValueError(f"records must be a contiguous float32 [>= {batch}, {n1}, {hv}, {width}] tensor")


def check_chunk_args(q, k, v, g, beta, anc, ssm_state, cache_slot):
    """The recurrent step's checks (:func:`.tree_recurrent_ref._check_gdn_args`) with ``anc`` for the parents."""
    if anc.dim() != 3:
        raise ValueError("anc must be [B, N1, N1] (tree_ancestors of the parents)")
    dims = _check_gdn_args(q, k, v, g, beta, anc[..., 0], ssm_state, cache_slot)
    _check_anc(anc, dims[0], dims[1])
    return dims


def chunk_setup(q, k, v, g, beta, anc, ssm_state, cache_slot, scale, records):
    """The checks both implementations share; ``(dims, records, scale)`` with the records allocated when None and
    the scale defaulting to K**-0.5."""
    dims = check_chunk_args(q, k, v, g, beta, anc, ssm_state, cache_slot)
    batch, n1, _, hv, kdim, vdim = dims
    width = record_width(kdim, vdim)
    if records is None:
        records = torch.empty(batch, n1, hv, width, dtype=torch.float32, device=q.device)
    _check_records(records, batch, n1, hv, width)
    return dims, records, kdim ** -0.5 if scale is None else scale


# ------------------------------------------------------------------------------------------------ ancestors


def tree_ancestors_torch(parent: torch.Tensor) -> torch.Tensor:
    """``anc[b, i, j] = 1`` when node j is node i or one of its ancestors (int8 [B, N1, N1]).

    Pointer doubling on the parent matrix (ceil(log2 N1) squarings of a 0/1 matrix, exact in float32 for N1 <=
    1025): no host synchronisation, fixed shapes. Nodes whose parent is -1 are roots of their own."""
    if parent.dim() != 2:
        raise ValueError("parent must be [B, N1]")
    batch, n1 = parent.shape
    if not 1 <= n1 <= MAX_TREE_NODES:
        raise ValueError(f"N1 must be in [1, {MAX_TREE_NODES}]")
    eye = torch.eye(n1, device=parent.device, dtype=torch.float32).expand(batch, n1, n1)
    p = parent.long()
    up = torch.zeros(batch, n1, n1 + 1, device=parent.device, dtype=torch.float32)
    up.scatter_(2, torch.where(p >= 0, p, torch.full_like(p, n1)).unsqueeze(2), 1.0)
    reach = eye + up[..., :n1]  # self and parent
    steps = 1
    while steps < n1:
        reach = (torch.bmm(reach, reach) > 0).to(torch.float32)
        steps *= 2
    return reach.to(torch.int8)


# ------------------------------------------------------------------------------------------------- verify


def tree_gdn_chunk_torch(q, k, v, g, beta, anc, ssm_state, cache_slot, scale=None, use_qk_l2norm=False,
                         records=None):
    """Reference for :func:`.tree_chunk.tree_gated_delta_rule_chunk`: the chunk form as dense matrices (one
    unit-lower-triangular solve per request and value head)."""
    (batch, n1, heads, hv, kdim, vdim), records, scale = chunk_setup(q, k, v, g, beta, anc, ssm_state, cache_slot,
                                                                     scale, records)
    cdt = torch.promote_types(q.dtype, torch.float32)
    qf, kf = qk_per_value_head(q, k, hv, cdt, use_qk_l2norm, scale)
    m = anc.to(cdt)  # [B, N1, N1], self included
    gsum = torch.bmm(m, g.to(cdt))  # [B, N1, HV]: log decay from the committed state to each node
    # [B, HV, N1, *]
    qh, kh, vh = (t.transpose(1, 2) for t in (qf, kf, v.to(cdt)))
    gh, bh = gsum.transpose(1, 2), beta.to(cdt).transpose(1, 2)
    h0 = _gather_rows(ssm_state, cache_slot).to(cdt)  # [B, HV, V, K]
    diff = (gh[..., :, None] - gh[..., None, :]).clamp(max=0)
    decay = torch.where(m[:, None] > 0, torch.exp(diff), torch.zeros_like(diff))  # [B, HV, N1, N1]
    eye = torch.eye(n1, dtype=cdt, device=q.device)
    strict = decay * (1 - eye)
    a = bh[..., None] * (kh @ kh.transpose(-1, -2)) * strict
    eg = torch.exp(gh)[..., None]
    rhs = bh[..., None] * (vh - eg * (kh @ h0.transpose(-1, -2)))
    u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    o = eg * (qh @ h0.transpose(-1, -2)) + ((qh @ kh.transpose(-1, -2)) * decay) @ u
    records[:batch].copy_(torch.cat([u, kh, gh[..., None]], dim=-1).transpose(1, 2))
    return o.transpose(1, 2).to(q.dtype), records


# ------------------------------------------------------------------------------------------------- commit


def _check_commit(ssm_pools, records, path, steps, src_slot, dst_slot):
    if ssm_pools.dim() != 5 or records.dim() != 5:
        raise ValueError("expected ssm_pools [L, slots, HV, V, K] and records [L, rows, N1, HV, V + K + 1]")
    layers, _, hv, vdim, kdim = ssm_pools.shape
    batch = steps.shape[0]
    if (records.shape[0] != layers or records.shape[1] < batch or records.shape[3] != hv
            or records.shape[4] != record_width(kdim, vdim) or records.dtype != torch.float32):
        raise ValueError(f"records must be float32 [L={layers}, >= {batch}, N1, HV={hv}, "
                         f"{record_width(kdim, vdim)}] for ssm_pools {tuple(ssm_pools.shape)}")
    if path.dim() != 2 or path.shape[0] != batch:
        raise ValueError(f"path must be [B={batch}, P] (the accepted nodes, root first)")
    if steps.shape != (batch,) or src_slot.shape != (batch,) or dst_slot.shape != (batch,):
        raise ValueError(f"steps, src_slot and dst_slot must be [B={batch}]")
    if tuple(ssm_pools.stride()[2:]) != (vdim * kdim, kdim, 1):
        raise ValueError("ssm_pools must be contiguous inside a slot ([HV, V, K])")


def commit_tree_records_layers_torch(ssm_pools, records, path, steps, src_slot, dst_slot):
    """Reference for :func:`.tree_chunk.commit_tree_records_layers` (loops; may synchronise)."""
    _check_commit(ssm_pools, records, path, steps, src_slot, dst_slot)
    vdim, kdim = ssm_pools.shape[3], ssm_pools.shape[4]
    for b in range(steps.shape[0]):
        step, src, dst = int(steps[b]), int(src_slot[b]), int(dst_slot[b])
        if step < 0 or src < 0 or dst < 0:
            continue
        nodes = path[b, : step + 1].long()
        rec = records[:, b, nodes]  # [L, P, HV, W]
        u, kh, gs = rec[..., :vdim], rec[..., vdim:vdim + kdim], rec[..., vdim + kdim]
        g_last = gs[:, -1]  # [L, HV]
        w = torch.exp((g_last[:, None] - gs).clamp(max=0))  # [L, P, HV]
        upd = torch.einsum("lph,lphv,lphk->lhvk", w, u, kh)
        new = torch.exp(g_last)[..., None, None] * ssm_pools[:, src].float() + upd
        ssm_pools[:, dst] = new.to(ssm_pools.dtype)
    return ssm_pools


def commit_tree_conv_layers_torch(conv_pools, node_conv, accepted_last_node, cache_slot):
    """Reference for :func:`.tree_chunk.commit_tree_conv_layers`: copy the accepted node's conv windows."""
    w = node_conv.shape[-1]
    keep = ((cache_slot >= 0) & (accepted_last_node >= 0)).nonzero().flatten()
    a, s = accepted_last_node[keep].long(), cache_slot[keep].long()
    conv_pools[:, s, :, :w] = node_conv[:, keep, a].to(conv_pools.dtype)
    return conv_pools
