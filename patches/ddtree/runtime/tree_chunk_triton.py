"""Triton kernels of the tree gated delta rule in chunk form (semantics and the reference: :mod:`.tree_chunk`).

* ``_tree_gdn_tri_kernel``: grid (node blocks, B * HV). The inverse of each diagonal block of ``I + A`` (BT = 16
  nodes: node order is parent-before-child, so the system is unit lower triangular in it), by forward
  substitution in registers, into a small scratch. It does not depend on V, so it runs once per block, not once
  per V slice, and the blocks run in parallel.
* ``_tree_gdn_chunk_kernel``: grid (V blocks, B * HV). One program owns a [BV] slice of one value head of one
  request and the whole tree, block after block: the right-hand side and the committed state's contribution to
  the outputs from one [K, BV] tile of the committed state held in registers; the earlier blocks' terms through
  their deltas (read back from ``records``, written earlier by this same program); the block's deltas as its
  triangle's inverse times the right-hand side; then the block's outputs. Dots only, no per-row reductions. Every
  node's delta u goes to ``records``; the V-block 0 program also writes the node's normalised key and path log
  decay (read by the commit only: within the verify every program reads keys and decays from the inputs).
* ``_commit_records_kernel``: grid (B, HV * V blocks, layers): the accepted node's state rebuilt from the
  committed state and the deltas along the accepted path (at most L + 1 rank-one terms), written to the slot.
* Conv windows are committed by :mod:`.tree_recurrent_triton`'s ``_commit_kernel`` with no SSM chunks.

No host synchronisation, fixed shapes: every launch can be captured in a CUDA graph.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .tree_chunk_ref import _check_commit, chunk_setup, record_width

BT = 16  # nodes per block (tl.dot needs >= 16)


@triton.jit
def _load_rows(ptr, rows, mrows, stride_n, o_k, mk, L2NORM: tl.constexpr):
    x = tl.load(ptr + rows[:, None] * stride_n + o_k[None, :], mask=mrows[:, None] & mk[None, :],
                other=0.0).to(tl.float32)
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def _tree_gdn_tri_kernel(
    k_ptr, gs_ptr, beta_ptr, anc_ptr, tri_ptr, rec_ptr,
    sk_b, sk_n, sk_h, sg_b, sg_n, sbt_b, sbt_n, sa_b, sa_i,
    N1: tl.constexpr, NP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    W: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr,
):
    blk = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // HV
    hv = i_bh % HV
    h = hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_t = tl.arange(0, BT)
    r = blk * BT + o_t
    mr = r < N1
    kr = _load_rows(k_ptr + b * sk_b + h * sk_h, r, mr, sk_n, o_k, o_k < K, L2NORM)
    gr = tl.load(gs_ptr + b * sg_b + r * sg_n + hv, mask=mr, other=0.0).to(tl.float32)
    br = tl.load(beta_ptr + b * sbt_b + r * sbt_n + hv, mask=mr, other=0.0).to(tl.float32)
    m = tl.load(anc_ptr + b * sa_b + r[:, None] * sa_i + r[None, :], mask=mr[:, None] & mr[None, :], other=0)
    dec = tl.where((m != 0) & (o_t[:, None] > o_t[None, :]), tl.exp(tl.minimum(gr[:, None] - gr[None, :], 0.0)), 0.0)
    a = tl.dot(kr, tl.trans(kr), input_precision=PREC) * dec * br[:, None]
    # T = (I + A)^-1, row by row: T_i = e_i - sum_{m < i} A[i, m] T_m
    t = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    for i in tl.static_range(1, BT):
        sel = o_t == i
        a_row = tl.sum(tl.where(sel[:, None], a, 0.0), 0)
        t_i = tl.where(sel, 1.0, 0.0) - tl.sum(a_row[:, None] * t, 0)
        t = tl.where(sel[:, None], t_i[None, :], t)
    tl.store(tri_ptr + (i_bh * NP + r[:, None]) * BT + o_t[None, :], t)
    # the nodes' normalised keys and path log decays, into their records (the verify reads them back from there)
    rec = rec_ptr + (b * N1 * HV + hv) * W
    tl.store(rec + r[:, None] * (HV * W) + V + o_k[None, :], kr, mask=mr[:, None] & (o_k < K)[None, :])
    tl.store(rec + r * (HV * W) + V + K, gr, mask=mr)


@triton.jit
def _tree_gdn_chunk_kernel(
    q_ptr, k_ptr, v_ptr, gs_ptr, beta_ptr, anc_ptr, slot_ptr, h0_ptr, o_ptr, rec_ptr, tri_ptr,
    scale,
    sq_b, sq_n, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h,
    sg_b, sg_n, sbt_b, sbt_n, sa_b, sa_i, sh0_s,
    so_b, so_n, so_h,
    N1: tl.constexpr, NP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    W: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
    PREC: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // HV
    hv = i_bh % HV
    h = hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    mk = o_k < K
    mv = o_v < V

    slot = tl.load(slot_ptr + b).to(tl.int64)
    # the committed state's [K, BV] tile, transposed (h0[v, k] at v * K + k)
    h0t = tl.load(h0_ptr + tl.maximum(slot, 0) * sh0_s + hv * V * K + o_v[None, :] * K + o_k[:, None],
                  mask=mk[:, None] & mv[None, :] & (slot >= 0), other=0.0).to(tl.float32)
    q_base = q_ptr + b * sq_b + h * sq_h
    v_base = v_ptr + b * sv_b + hv * sv_h
    rec_node = HV * W  # records [B, N1, HV, W]: node stride
    rec_base = rec_ptr + b * N1 * rec_node + hv * W
    a_base = anc_ptr + b * sa_b

    for blk in range(0, tl.cdiv(N1, BT)):
        r = blk * BT + o_t
        mr = r < N1
        kr = tl.load(rec_base + r[:, None] * rec_node + V + o_k[None, :], mask=mr[:, None] & mk[None, :], other=0.0)
        qr = _load_rows(q_base, r, mr, sq_n, o_k, mk, L2NORM) * scale
        vr = tl.load(v_base + r[:, None] * sv_n + o_v[None, :], mask=mr[:, None] & mv[None, :],
                     other=0.0).to(tl.float32)
        gr = tl.load(rec_base + r * rec_node + V + K, mask=mr, other=0.0)
        br = tl.load(beta_ptr + b * sbt_b + r * sbt_n + hv, mask=mr, other=0.0).to(tl.float32)
        eg = tl.exp(gr)
        rhs = br[:, None] * (vr - eg[:, None] * tl.dot(kr, h0t, input_precision=PREC))
        acc = eg[:, None] * tl.dot(qr, h0t, input_precision=PREC)
        for jb in range(0, blk):  # the deltas of earlier blocks (ancestors only, by the mask)
            c = jb * BT + o_t
            kc = tl.load(rec_base + c[:, None] * rec_node + V + o_k[None, :], mask=mk[None, :], other=0.0)
            gc = tl.load(rec_base + c * rec_node + V + K)
            uc = tl.load(rec_base + c[:, None] * rec_node + o_v[None, :], mask=mv[None, :], other=0.0,
                         cache_modifier=".cg")
            m = tl.load(a_base + r[:, None] * sa_i + c[None, :], mask=mr[:, None], other=0)
            if tl.max(m) > 0:  # a block holding none of these nodes' ancestors adds nothing
                dec = tl.where(m != 0, tl.exp(tl.minimum(gr[:, None] - gc[None, :], 0.0)), 0.0)
                akk = tl.dot(kr, tl.trans(kc), input_precision=PREC) * dec * br[:, None]
                rhs -= tl.dot(akk, uc, input_precision=PREC)
                aqk = tl.dot(qr, tl.trans(kc), input_precision=PREC) * dec
                acc += tl.dot(aqk, uc, input_precision=PREC)
        # the block's own triangle: u = (I + A_blk)^-1 rhs, the inverse from _tree_gdn_tri_kernel
        tri = tl.load(tri_ptr + (i_bh * NP + r[:, None]) * BT + o_t[None, :])
        u = tl.dot(tri, rhs, input_precision=PREC)
        m = tl.load(a_base + r[:, None] * sa_i + r[None, :], mask=mr[:, None] & mr[None, :], other=0)
        dec = tl.where(m != 0, tl.exp(tl.minimum(gr[:, None] - gr[None, :], 0.0)), 0.0)
        aqk = tl.dot(qr, tl.trans(kr), input_precision=PREC) * dec
        acc += tl.dot(aqk, u, input_precision=PREC)
        tl.store(o_ptr + b * so_b + r[:, None] * so_n + hv * so_h + o_v[None, :],
                 acc.to(o_ptr.dtype.element_ty), mask=mr[:, None] & mv[None, :])
        tl.store(rec_base + r[:, None] * rec_node + o_v[None, :], u, mask=mr[:, None] & mv[None, :])
        tl.debug_barrier()  # this program reads the block's records back in later blocks


#: Launch configuration: ``prec`` the dots' input precision ("ieee": float32 FMA; "tf32x3": tensor cores, three
#: products, float32-level accuracy), ``warps`` / ``bv`` the verify kernel's warps and V block (0 = by the batch),
#: ``tri_warps`` the triangle kernel's warps. ``DDTREE_GDN_CHUNK`` ("prec=tf32x3,warps=4,bv=32") overrides any.
#: Default from bench/results/gdn-chunk-sweep-h200.md: float32 FMA dots, 4 warps, V blocks of 64 were within 12 % of
#: the fastest configuration at every shape swept (batch 1 / 16 x 17 / 65 nodes), and the fastest at batch 16.
CONFIG = {"prec": "ieee", "warps": 4, "bv": 64, "tri_warps": 2}


def _config() -> dict:
    """CONFIG with ``DDTREE_GDN_CHUNK`` applied; parsed once per distinct value (every GDN layer of every round asks)."""
    import os

    return dict(_parse_config(os.environ.get("DDTREE_GDN_CHUNK", ""), tuple(sorted(CONFIG.items()))))


@functools.lru_cache(maxsize=8)
def _parse_config(text: str, defaults: tuple) -> tuple:
    cfg = dict(defaults)
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in cfg:
            raise ValueError(f"DDTREE_GDN_CHUNK: unknown key {key.strip()!r} (known: {', '.join(cfg)})")
        cfg[key.strip()] = value.strip() if key.strip() == "prec" else int(value)
    if cfg["prec"] not in ("ieee", "tf32x3", "tf32"):
        raise ValueError(f"DDTREE_GDN_CHUNK: prec must be ieee, tf32x3 or tf32, got {cfg['prec']!r}")
    return tuple(cfg.items())


def _pick_bv(batch: int, hv: int, vdim: int, on_cuda: bool, cfg: dict) -> int:
    """The V block: ``CONFIG["bv"]`` (>= 16: tl.dot needs it); with 0, 32 once that still gives about two programs
    per SM on an H200, else 16. The CPU interpreter runs programs one after another, so there one block covers V."""
    full = max(16, triton.next_power_of_2(vdim))
    if not on_cuda:
        return full
    if cfg["bv"]:
        return max(16, min(int(cfg["bv"]), full))
    bv = min(32, full)
    if bv > 16 and batch * hv * triton.cdiv(vdim, bv) < 264:
        bv = 16
    return bv


def tree_gdn_chunk_triton(q, k, v, g, beta, anc, ssm_state, cache_slot, scale=None, use_qk_l2norm=False,
                          records=None):
    (batch, n1, heads, hv, kdim, vdim), records, scale = chunk_setup(q, k, v, g, beta, anc, ssm_state, cache_slot,
                                                                     scale, records)
    width = record_width(kdim, vdim)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if tuple(ssm_state.stride()[1:]) != (vdim * kdim, kdim, 1):
        raise ValueError("ssm_state must be contiguous inside a slot ([HV, V, K])")
    anc = anc if anc.stride(2) == 1 else anc.contiguous()
    # the path log decay of every node (sum of g over its ancestors and itself): one small batched matmul (a float32
    # mask, as TreeVerify keeps it for the round, is used as it is; the kernels read either dtype)
    gsum = torch.bmm(anc if anc.dtype == torch.float32 else anc.to(torch.float32), g.to(torch.float32))
    beta = beta if beta.stride(2) == 1 else beta.contiguous()
    o = torch.empty(batch, n1, hv, vdim, dtype=q.dtype, device=q.device)
    cfg = _config()
    prec = cfg["prec"] if q.is_cuda else "ieee"
    bk = max(16, triton.next_power_of_2(kdim))
    bv = _pick_bv(batch, hv, vdim, q.is_cuda, cfg)
    nb = triton.cdiv(n1, BT)
    tri = torch.empty(batch * hv, nb * BT, BT, dtype=torch.float32, device=q.device)
    _tree_gdn_tri_kernel[(nb, batch * hv)](
        k, gsum, beta, anc, tri, records,
        k.stride(0), k.stride(1), k.stride(2), gsum.stride(0), gsum.stride(1), beta.stride(0), beta.stride(1),
        anc.stride(0), anc.stride(1),
        N1=n1, NP=nb * BT, H=heads, HV=hv, K=kdim, V=vdim, W=width, BT=BT, BK=bk, L2NORM=bool(use_qk_l2norm),
        PREC=prec, num_warps=int(cfg["tri_warps"]),
    )
    grid = (triton.cdiv(vdim, bv), batch * hv)
    _tree_gdn_chunk_kernel[grid](
        q, k, v, gsum, beta, anc, cache_slot, ssm_state, o, records, tri,
        float(scale),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        gsum.stride(0), gsum.stride(1), beta.stride(0), beta.stride(1), anc.stride(0), anc.stride(1),
        ssm_state.stride(0),
        o.stride(0), o.stride(1), o.stride(2),
        N1=n1, NP=nb * BT, H=heads, HV=hv, K=kdim, V=vdim, W=width, BT=BT, BK=bk, BV=bv,
        L2NORM=bool(use_qk_l2norm), PREC=prec, num_warps=int(cfg["warps"]),
    )
    return o, records


@triton.jit
def _commit_records_kernel(
    ssm_ptr, rec_ptr, path_ptr, step_ptr, src_ptr, dst_ptr,
    s_ssm_l, s_ssm_s, s_rec_l, s_rec_b, s_path_b,
    N1: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, P: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NVB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hv = (tl.program_id(1) // NVB).to(tl.int64)
    i_v = tl.program_id(1) % NVB
    layer = tl.program_id(2).to(tl.int64)
    step = tl.load(step_ptr + b).to(tl.int64)
    src = tl.load(src_ptr + b).to(tl.int64)
    dst = tl.load(dst_ptr + b).to(tl.int64)
    if (step >= 0) & (step < P) & (src >= 0) & (dst >= 0):
        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        mk = o_k < K
        mv = o_v < V
        rec = rec_ptr + layer * s_rec_l + b * s_rec_b + hv * W
        last = tl.load(path_ptr + b * s_path_b + step).to(tl.int64)
        g_last = tl.load(rec + last * HV * W + V + K)
        acc = tl.zeros([BV, BK], dtype=tl.float32)
        for t in range(0, P):  # the path's width bounds the loop (a constant: no data-dependent trip count)
            on = t <= step
            j = tl.maximum(tl.load(path_ptr + b * s_path_b + t, mask=on, other=0).to(tl.int64), 0)
            u = tl.load(rec + j * HV * W + o_v, mask=mv & on, other=0.0)
            kk = tl.load(rec + j * HV * W + V + o_k, mask=mk & on, other=0.0)
            gj = tl.load(rec + j * HV * W + V + K, mask=on, other=0.0)
            acc += tl.where(on, tl.exp(tl.minimum(g_last - gj, 0.0)), 0.0) * u[:, None] * kk[None, :]
        tile = o_v[:, None] * K + o_k[None, :]
        mt = mv[:, None] & mk[None, :]
        h0 = tl.load(ssm_ptr + layer * s_ssm_l + src * s_ssm_s + hv * V * K + tile, mask=mt, other=0.0)
        acc += tl.exp(g_last) * h0.to(tl.float32)
        tl.store(ssm_ptr + layer * s_ssm_l + dst * s_ssm_s + hv * V * K + tile, acc.to(ssm_ptr.dtype.element_ty),
                 mask=mt)


def commit_tree_records_layers_triton(ssm_pools, records, path, steps, src_slot, dst_slot):
    _check_commit(ssm_pools, records, path, steps, src_slot, dst_slot)
    layers, _, hv, vdim, kdim = ssm_pools.shape
    batch = steps.shape[0]
    if batch == 0 or layers == 0:
        return ssm_pools
    if tuple(records.stride()[2:]) != (hv * records.shape[4], records.shape[4], 1):
        raise ValueError("records must be contiguous per request ([N1, HV, V + K + 1])")
    path = path if path.stride(1) == 1 else path.contiguous()
    bk = triton.next_power_of_2(kdim)
    bv = min(32, triton.next_power_of_2(vdim)) if ssm_pools.is_cuda else triton.next_power_of_2(vdim)
    nvb = triton.cdiv(vdim, bv)
    _commit_records_kernel[(batch, hv * nvb, layers)](
        ssm_pools, records, path, steps, src_slot, dst_slot,
        ssm_pools.stride(0), ssm_pools.stride(1), records.stride(0), records.stride(1), path.stride(0),
        N1=records.shape[2], HV=hv, K=kdim, V=vdim, W=records.shape[4], P=path.shape[1], BK=bk, BV=bv, NVB=nvb, num_warps=4,
    )
    return ssm_pools


def commit_tree_conv_layers_triton(conv_pools, node_conv, accepted_last_node, cache_slot):
    """The conv half of :func:`.tree_recurrent_triton.commit_tree_states_triton` (its kernel, no SSM chunks)."""
    from .tree_recurrent_triton import _commit_kernel

    layers, batch = node_conv.shape[0], accepted_last_node.shape[0]
    if batch == 0 or layers == 0:
        return conv_pools
    dim, w = node_conv.shape[3], node_conv.shape[4]
    block = 1024
    nc = triton.cdiv(dim * w, block)
    _commit_kernel[(batch, nc, layers)](
        conv_pools, conv_pools, node_conv, node_conv, accepted_last_node, cache_slot,
        node_conv.shape[2], 0, dim,
        0, conv_pools.stride(1), conv_pools.stride(2), conv_pools.stride(3),
        0, 0, node_conv.stride(1), node_conv.stride(2), node_conv.stride(3), node_conv.stride(4),
        0, conv_pools.stride(0), 0, node_conv.stride(0),
        W=w, BLOCK=block, NS_CHUNKS=0, num_warps=4,
    )
    return conv_pools
