"""Triton kernels for recurrent-state branching (semantics, layouts and the reference: :mod:`.tree_recurrent`).

* ``_tree_conv_kernel``: grid (B * N1, D blocks). Conv windows do not depend on earlier outputs, so every node is
  independent: each program walks K_conv - 1 parent pointers (scalar loads) and gathers its path inputs, falling
  back into the committed conv state, then writes its output and its window.
* ``_tree_gdn_kernel``: grid (V blocks, B * HV). One program owns a [BV, K] slice of one head's state and runs the
  nodes in index order. The running state stays in registers while the parent is the previous node (a chain
  costs no reloads); otherwise it reloads the parent's state from ``node_ssm`` (written earlier by this same
  program) or the committed state. Every node's state is stored (needed for commit); with a narrower buffer
  dtype the register state is rounded to it after each store so chains and branches agree bit for bit.
* ``_commit_kernel``: grid (B, SSM chunks + conv chunks, layers): one launch copies both states of every request,
  for one recurrent layer or for all layers of a pool at once.

No host synchronisation, fixed shapes: all three launches can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tree_recurrent_ref import _check_conv_args, _check_gdn_args


@triton.jit
def _tree_conv_kernel(
    x_ptr, parent_ptr, slot_ptr, cs_ptr, w_ptr, bias_ptr, y_ptr, win_ptr,
    N1, D,
    sx_b, sx_n, sx_d,
    sp_b,
    scs_s, scs_d, scs_t,
    sw_d, sw_k,
    sy_b, sy_n, sy_d,
    swin_b, swin_n, swin_d, swin_t,
    KC: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // N1
    n = pid % N1
    offs_d = tl.program_id(1) * BD + tl.arange(0, BD)
    md = offs_d < D
    slot = tl.load(slot_ptr + b).to(tl.int64)
    acc = tl.zeros([BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_d, mask=md, other=0.0).to(tl.float32)
    cur = n  # node j steps back along the path (-1 once past the root)
    back = n * 0  # committed-state columns consumed so far
    for j in tl.static_range(KC):
        is_node = cur >= 0
        xv = tl.load(x_ptr + b * sx_b + tl.maximum(cur, 0) * sx_n + offs_d * sx_d, mask=md & is_node, other=0.0)
        col = tl.maximum(KC - 2 - back, 0)
        sv = tl.load(cs_ptr + tl.maximum(slot, 0) * scs_s + offs_d * scs_d + col * scs_t,
                     mask=md & (cur < 0) & (slot >= 0), other=0.0)
        val = tl.where(is_node, xv.to(tl.float32), sv.to(tl.float32))
        wv = tl.load(w_ptr + offs_d * sw_d + (KC - 1 - j) * sw_k, mask=md, other=0.0).to(tl.float32)
        acc += val * wv
        if j < KC - 1:  # the window keeps the newest KC - 1 inputs, oldest first (slot KC - 2 = the node itself)
            tl.store(win_ptr + b * swin_b + n * swin_n + offs_d * swin_d + (KC - 2 - j) * swin_t,
                     val.to(win_ptr.dtype.element_ty), mask=md)
        if j < KC - 1:
            nxt = tl.load(parent_ptr + b * sp_b + tl.maximum(cur, 0), mask=is_node, other=-1).to(tl.int64)
            back = back + tl.where(is_node, 0, 1)
            cur = tl.where(is_node, nxt, -1)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + b * sy_b + n * sy_n + offs_d * sy_d, acc.to(y_ptr.dtype.element_ty), mask=md)


def tree_causal_conv1d_triton(x, parent, conv_state, cache_slot, weight, bias=None, activation=None, node_conv=None):
    batch, n1, dim, k_conv = _check_conv_args(x, parent, conv_state, cache_slot, weight, bias)
    if activation not in (None, "silu", "swish", True, False):
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    w = k_conv - 1
    if node_conv is None:
        node_conv = torch.empty(batch, n1, dim, w, dtype=conv_state.dtype, device=x.device)
    elif tuple(node_conv.shape) != (batch, n1, dim, w):
        raise ValueError(f"node_conv must be [{batch}, {n1}, {dim}, {w}]")
    parent = parent if parent.stride(1) == 1 else parent.contiguous()
    y = torch.empty(batch, n1, dim, dtype=x.dtype, device=x.device)
    # on the GPU 256 channels a program; the CPU interpreter runs programs one after another at a cost per
    # operation, not per element, so there one block covers D (the same kernel, a third of the programs at Qwen3.6)
    bd = min(triton.next_power_of_2(dim), 256) if x.is_cuda else triton.next_power_of_2(dim)
    grid = (batch * n1, triton.cdiv(dim, bd))
    _tree_conv_kernel[grid](
        x, parent, cache_slot, conv_state, weight, bias if bias is not None else weight, y, node_conv,
        n1, dim,
        *x.stride(), parent.stride(0), *conv_state.stride(), *weight.stride(), *y.stride(), *node_conv.stride(),
        KC=k_conv, BD=bd, HAS_BIAS=bias is not None, SILU=activation in ("silu", "swish", True),
        num_warps=4 if bd >= 256 else 2,
    )
    return y, node_conv


@triton.jit
def _tree_gdn_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, parent_ptr, slot_ptr, h0_ptr, o_ptr, hs_ptr,
    scale,
    sq_b, sq_n, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h,
    sg_b, sg_n, sbt_b, sbt_n, sp_b, sh0_s,
    so_b, so_n, so_h,
    N1: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, ROUND: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // HV
    hv = i_bh % HV
    h = hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < K
    mv = o_v < V
    mh = mv[:, None] & mk[None, :]
    tile = o_v[:, None] * K + o_k[None, :]  # [BV, BK] offsets inside one head's [V, K] state

    slot = tl.load(slot_ptr + b).to(tl.int64)
    h0_tile = h0_ptr + tl.maximum(slot, 0) * sh0_s + hv * V * K + tile
    hs_head = hs_ptr + (b * N1 * HV + hv) * V * K + tile  # node i: + i * HV * V * K
    b_h = tl.zeros([BV, BK], dtype=tl.float32)
    for i in range(0, N1):
        p = tl.load(parent_ptr + b * sp_b + i).to(tl.int64)
        if p < 0:
            b_h = tl.load(h0_tile, mask=mh & (slot >= 0), other=0.0).to(tl.float32)
        elif p != i - 1:
            tl.debug_barrier()  # the parent's state was stored by this program; order the store before the load
            b_h = tl.load(hs_head + p * HV * V * K, mask=mh, other=0.0, cache_modifier=".cg").to(tl.float32)
        b_q = tl.load(q_ptr + b * sq_b + i * sq_n + h * sq_h + o_k, mask=mk, other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + b * sk_b + i * sk_n + h * sk_h + o_k, mask=mk, other=0.0).to(tl.float32)
        b_v = tl.load(v_ptr + b * sv_b + i * sv_n + hv * sv_h + o_v, mask=mv, other=0.0).to(tl.float32)
        b_g = tl.load(g_ptr + b * sg_b + i * sg_n + hv).to(tl.float32)
        b_beta = tl.load(beta_ptr + b * sbt_b + i * sbt_n + hv).to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_h = b_h * tl.exp(b_g)
        b_v = (b_v - tl.sum(b_h * b_k[None, :], 1)) * b_beta
        b_h = b_h + b_v[:, None] * b_k[None, :]
        b_o = tl.sum(b_h * b_q[None, :], 1)
        tl.store(o_ptr + b * so_b + i * so_n + hv * so_h + o_v, b_o.to(o_ptr.dtype.element_ty), mask=mv)
        h_st = b_h.to(hs_ptr.dtype.element_ty)
        tl.store(hs_head + i * HV * V * K, h_st, mask=mh)
        if ROUND:
            b_h = h_st.to(tl.float32)


def _pick_bv(batch: int, hv: int, vdim: int, on_cuda: bool = True) -> int:
    """Smaller V blocks when the batch is small, so that enough programs run (about two per SM on an H200).
    The CPU interpreter runs programs one after another, so there one block covers V."""
    if not on_cuda:
        return triton.next_power_of_2(vdim)
    bv = min(32, triton.next_power_of_2(vdim))
    while bv > 8 and batch * hv * triton.cdiv(vdim, bv) < 264:
        bv //= 2
    return bv


def tree_gated_delta_rule_triton(q, k, v, g, beta, parent, ssm_state, cache_slot, scale=None, use_qk_l2norm=False,
                                 node_ssm=None, state_dtype=None):
    batch, n1, heads, hv, kdim, vdim = _check_gdn_args(q, k, v, g, beta, parent, ssm_state, cache_slot)
    if scale is None:
        scale = kdim ** -0.5
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if g.stride(2) != 1 or beta.stride(2) != 1:
        g, beta = g.contiguous(), beta.contiguous()
    if tuple(ssm_state.stride()[1:]) != (vdim * kdim, kdim, 1):
        raise ValueError("ssm_state must be contiguous inside a slot ([HV, V, K])")
    if node_ssm is None:
        node_ssm = torch.empty(batch, n1, hv, vdim, kdim, dtype=state_dtype or ssm_state.dtype, device=q.device)
    elif tuple(node_ssm.shape) != (batch, n1, hv, vdim, kdim) or not node_ssm.is_contiguous():
        raise ValueError(f"node_ssm must be a contiguous [{batch}, {n1}, {hv}, {vdim}, {kdim}] tensor")
    parent = parent if parent.stride(1) == 1 else parent.contiguous()
    o = torch.empty(batch, n1, hv, vdim, dtype=q.dtype, device=q.device)
    bk = triton.next_power_of_2(kdim)
    bv = _pick_bv(batch, hv, vdim, q.is_cuda)
    grid = (triton.cdiv(vdim, bv), batch * hv)
    _tree_gdn_kernel[grid](
        q, k, v, g, beta, parent, cache_slot, ssm_state, o, node_ssm,
        float(scale),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), parent.stride(0), ssm_state.stride(0),
        o.stride(0), o.stride(1), o.stride(2),
        N1=n1, H=heads, HV=hv, K=kdim, V=vdim, BK=bk, BV=bv, L2NORM=bool(use_qk_l2norm),
        ROUND=node_ssm.dtype != torch.float32,
        num_warps=1 if bv <= 8 else (2 if bv <= 16 else 4),
    )
    return o, node_ssm


@triton.jit
def _commit_kernel(
    ssm_ptr, cs_ptr, nssm_ptr, nconv_ptr, acc_ptr, slot_ptr,
    N1, S_SSM, D,
    s_ssm_s, scs_s, scs_d, scs_t,
    sn_b, sn_n, snc_b, snc_n, snc_d, snc_t,
    s_ssm_l, scs_l, sn_l, snc_l,
    W: tl.constexpr, BLOCK: tl.constexpr, NS_CHUNKS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)  # one recurrent layer per grid row (a single layer: 0, strides unused)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    a = tl.load(acc_ptr + b).to(tl.int64)
    ok = (slot >= 0) & (a >= 0) & (a < N1)
    if ok:
        # distinct names per branch: Triton requires a name assigned in both branches to keep one type, and the
        # two pools usually differ (fp32 SSM, bf16 conv)
        if c < NS_CHUNKS:
            e_s = c * BLOCK + tl.arange(0, BLOCK)
            m_s = e_s < S_SSM
            v_s = tl.load(nssm_ptr + layer * sn_l + b * sn_b + a * sn_n + e_s, mask=m_s)
            tl.store(ssm_ptr + layer * s_ssm_l + slot * s_ssm_s + e_s, v_s.to(ssm_ptr.dtype.element_ty), mask=m_s)
        else:
            e_c = (c - NS_CHUNKS) * BLOCK + tl.arange(0, BLOCK)
            m_c = e_c < D * W
            d = e_c // W
            t = e_c % W
            v_c = tl.load(nconv_ptr + layer * snc_l + b * snc_b + a * snc_n + d * snc_d + t * snc_t, mask=m_c)
            tl.store(cs_ptr + layer * scs_l + slot * scs_s + d * scs_d + t * scs_t,
                     v_c.to(cs_ptr.dtype.element_ty), mask=m_c)


def commit_tree_states_triton(ssm_state, conv_state, node_ssm, node_conv, accepted_last_node, cache_slot,
                              layered: bool = False):
    """``layered``: every tensor has a leading layer axis (``ssm_state`` [L, slots, HV, V, K], ``node_ssm``
    [L, rows >= B, N1, HV, V, K], ...): one launch commits all layers (grid axis 2)."""
    if not layered:
        ssm_state, conv_state, node_ssm, node_conv = (t.unsqueeze(0) for t in (ssm_state, conv_state, node_ssm,
                                                                               node_conv))
    layers = node_ssm.shape[0]
    batch = accepted_last_node.shape[0]
    n1 = node_ssm.shape[2]
    s_ssm = node_ssm[0, 0, 0].numel() if node_ssm.shape[1] else 0
    inner = node_ssm.shape[3:]
    contiguous_inner = tuple(torch.empty(inner, device="meta").stride())
    if (tuple(node_ssm.stride()[3:]) != contiguous_inner or node_ssm.stride(2) != s_ssm
            or tuple(ssm_state.stride()[2:]) != contiguous_inner):
        raise ValueError("node_ssm must be contiguous per request and ssm_state contiguous inside a slot")
    dim, w = node_conv.shape[3], node_conv.shape[4]
    block = 1024
    ns = triton.cdiv(s_ssm, block)
    nc = triton.cdiv(dim * w, block)
    if batch == 0 or layers == 0:
        return (ssm_state, conv_state) if layered else (ssm_state[0], conv_state[0])
    _commit_kernel[(batch, ns + nc, layers)](
        ssm_state, conv_state, node_ssm, node_conv, accepted_last_node, cache_slot,
        n1, s_ssm, dim,
        ssm_state.stride(1), conv_state.stride(1), conv_state.stride(2), conv_state.stride(3),
        node_ssm.stride(1), node_ssm.stride(2), node_conv.stride(1), node_conv.stride(2), node_conv.stride(3),
        node_conv.stride(4),
        ssm_state.stride(0), conv_state.stride(0), node_ssm.stride(0), node_conv.stride(0),
        W=w, BLOCK=block, NS_CHUNKS=ns, num_warps=4,
    )
    return (ssm_state, conv_state) if layered else (ssm_state[0], conv_state[0])
