"""Recurrent-state branching for DDTree verify on hybrid models (GatedDeltaNet / Mamba-style conv layers).

For attention layers a draft tree is only a mask. A recurrent layer instead needs, for every tree node, the
recurrent state of the node's own root->node path, and after acceptance the state of the last accepted node
must become the request's state. Three steps, each with a Triton kernel (:mod:`.tree_recurrent_triton`) and
the plain-torch reference in this file (``impl`` = "auto" | "triton" | "torch", as everywhere in the runtime):

1. :func:`tree_causal_conv1d` - causal depthwise conv1d where each node's window is the last ``K_conv - 1``
   inputs along its ancestor path, falling back into the request's committed conv state for shallow nodes.
2. :func:`tree_gated_delta_rule` - the GatedDeltaNet recurrence where each node starts from its parent's state
   (the root, and any node with parent -1, from the request's committed state). One pass in node order.
3. :func:`commit_tree_states` - copy the SSM state and conv window of each request's last accepted node into
   the request's cache slot, for the whole batch in one launch.

Inputs (B requests, N1 nodes each, node 0 = the root/bonus token, same layout as :class:`.types.DraftTree`):
``parent`` int [B, N1] with ``parent[b, i] < i`` for every node (parent before child) and -1 for the root.
Unused slots of a DraftTree have parent -1: they are computed like extra roots (correct and harmless, their
results are never accepted). Parent-before-child is a precondition, not checked on the device path
(:func:`check_parent_order` checks it with a host sync, for tests and debugging).

Layouts follow SGLang 0.5.11 so that pools and buffers can be passed straight through:

* SSM state pool ``ssm_state`` [num_slots, HV, V, K] (V-major per head, as SGLang's ``h0_source``; the
  recurrence below is written for that layout: ``h[v, k]``). Per-node states ``node_ssm`` [B, N1, HV, V, K]
  (SGLang's ``intermediate_ssm`` layout with one cache line per request).
* conv state pool ``conv_state`` [num_slots, D, state_len] (any strides), window = columns ``0 .. K_conv-2``
  oldest first, exactly the columns SGLang's ``causal_conv1d_update`` reads; ``state_len >= K_conv - 1``
  (SGLang allocates exactly ``K_conv - 1``; extra columns are neither read nor written).
  Per-node windows ``node_conv`` [B, N1, D, K_conv-1], oldest first (SGLang's ``intermediate_conv_window``).
* conv ``weight`` [D, K_conv] (column K_conv-1 multiplies the newest input), ``bias`` [D].
* q, k [B, N1, H, K]; v [B, N1, HV, V]; g, beta [B, N1, HV]; HV a multiple of H (GQA-style value heads).
* ``cache_slot`` int [B]: the request's slot in both pools; a negative slot marks a padded request (its committed
  state reads as zeros and commit skips it).

Recurrence (SGLang ``fused_recurrent_gated_delta_rule_update_fwd_kernel`` / fla ``fused_recurrent``), per node
with state h = parent's state, in fp32:
    (optional) q = q / sqrt(sum q^2 + 1e-6), k = k / sqrt(sum k^2 + 1e-6)
    h = h * exp(g)
    v' = beta * (v - h @ k)          # h @ k: sum over K
    h = h + outer(v', k)
    o = h @ (q * scale)
``g`` is the log decay (SGLang's fused sigmoid gating computes g = -exp(A_log) * softplus(a + dt_bias) and
beta = sigmoid(b) before this point; callers pass the results).

Which states are kept (decision): every node's state, for every layer, in ``node_ssm`` / ``node_conv``. The
accepted node is known only after the whole verify forward, so each recurrent layer's per-node states live
until commit (as SGLang's ``intermediate_ssm`` does for chains). Cost per node and layer:
``HV*V*K*bytes(ssm dtype) + D*(K_conv-1)*bytes(conv dtype)``; Qwen3-Next-80B (HV=32, K=V=128, D=8192, K_conv=4,
fp32 SSM, bf16 conv): 2 MiB + 48 KiB per node per layer, x36 GDN layers = 73.7 MiB per node per request, so a
budget of 64 costs 4.8 GB per running request. :func:`per_node_state_bytes` and :func:`max_budget_for_memory`
give the numbers for the start-up check. The cheaper alternative (keep only per-node inputs k, v, g, beta and the
conv inputs, ~128x smaller, and replay the <= L+1 accepted tokens at commit) is not implemented here.

Exactness / "state drift": each node's state is a function of its path only. With a narrower state buffer
(e.g. bf16 ``node_ssm``) the kernel rounds its running state through the buffer dtype after every node, so a
chain computed in registers and a branch reloaded from the buffer see identical values, and commit copies the
exact state the verify used (no approximate rollback).
"""
from __future__ import annotations

import torch

from ._dispatch import use_triton

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
    rep = hv // heads
    qf = q.to(cdt).repeat_interleave(rep, dim=2)
    kf = k.to(cdt).repeat_interleave(rep, dim=2)
    if use_qk_l2norm:
        qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    qf = qf * scale
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


# --------------------------------------------------------------------------------------------- public API


def tree_causal_conv1d(x: torch.Tensor, parent: torch.Tensor, conv_state: torch.Tensor, cache_slot: torch.Tensor,
                       weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
                       node_conv: torch.Tensor | None = None, impl: str = "auto"):
    """Tree causal conv1d. Returns ``(out [B, N1, D] in x.dtype, node_conv [B, N1, D, K_conv-1])``.

    ``out[b, i] = act(bias + sum_j weight[:, K_conv-1-j] * s_j)`` where s_0 = x[b, i], s_1 = x[b, parent], ...
    continuing into the committed window ``conv_state[cache_slot[b], :, :K_conv-1]`` (newest column last) once
    the path reaches the root. ``node_conv[b, i]`` is the window after node i (its last K_conv-1 path inputs,
    oldest first); pass a preallocated ``node_conv`` (e.g. a CUDA-graph buffer) to write into it.
    ``activation``: None or "silu"/"swish". Does not modify ``conv_state`` (see :func:`commit_tree_states`).
    """
    if use_triton(impl, x, parent, conv_state, cache_slot, weight):
        from .tree_recurrent_triton import tree_causal_conv1d_triton

        return tree_causal_conv1d_triton(x, parent, conv_state, cache_slot, weight, bias, activation, node_conv)
    return tree_causal_conv1d_torch(x, parent, conv_state, cache_slot, weight, bias, activation, node_conv)


def tree_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          parent: torch.Tensor, ssm_state: torch.Tensor, cache_slot: torch.Tensor,
                          scale: float | None = None, use_qk_l2norm: bool = False,
                          node_ssm: torch.Tensor | None = None, state_dtype: torch.dtype | None = None,
                          impl: str = "auto"):
    """Tree GatedDeltaNet recurrence. Returns ``(o [B, N1, HV, V] in q.dtype, node_ssm [B, N1, HV, V, K])``.

    Node i starts from ``node_ssm[b, parent[b, i]]`` (from ``ssm_state[cache_slot[b]]`` when the parent is -1);
    ``scale`` defaults to K**-0.5. ``node_ssm`` may be preallocated; otherwise it is allocated in
    ``state_dtype`` (default ``ssm_state.dtype``). Does not modify ``ssm_state`` (see :func:`commit_tree_states`).
    """
    if use_triton(impl, q, k, v, g, beta, parent, ssm_state, cache_slot):
        from .tree_recurrent_triton import tree_gated_delta_rule_triton

        return tree_gated_delta_rule_triton(q, k, v, g, beta, parent, ssm_state, cache_slot, scale, use_qk_l2norm,
                                            node_ssm, state_dtype)
    return tree_gated_delta_rule_torch(q, k, v, g, beta, parent, ssm_state, cache_slot, scale, use_qk_l2norm,
                                       node_ssm, state_dtype)


def commit_tree_states(ssm_state: torch.Tensor, conv_state: torch.Tensor, node_ssm: torch.Tensor,
                       node_conv: torch.Tensor, accepted_last_node: torch.Tensor, cache_slot: torch.Tensor,
                       impl: str = "auto"):
    """Make the last accepted node's states the requests' states, in place, for the whole batch at once.

    ``ssm_state[cache_slot[b]] = node_ssm[b, a]`` and ``conv_state[cache_slot[b], :, :K_conv-1] = node_conv[b, a]``
    with ``a = accepted_last_node[b]`` (the tree index of the last accepted node: ``WalkResult.accepted_nodes``
    at ``accept_len``). Requests with a negative slot or node are skipped. Slots must be distinct among the
    committed requests. Returns ``(ssm_state, conv_state)``.
    """
    batch = accepted_last_node.shape[0]
    if cache_slot.shape != (batch,) or node_ssm.shape[0] != batch or node_conv.shape[0] != batch:
        raise ValueError("accepted_last_node, cache_slot, node_ssm and node_conv must share B")
    if tuple(node_ssm.shape[2:]) != tuple(ssm_state.shape[1:]):
        raise ValueError("node_ssm [B, N1, HV, V, K] must match ssm_state [slots, HV, V, K]")
    if node_conv.shape[2] != conv_state.shape[1] or conv_state.shape[2] < node_conv.shape[3]:
        raise ValueError("node_conv [B, N1, D, K_conv-1] must match conv_state [slots, D, >= K_conv-1]")
    if use_triton(impl, ssm_state, conv_state, node_ssm, node_conv, accepted_last_node, cache_slot):
        from .tree_recurrent_triton import commit_tree_states_triton

        return commit_tree_states_triton(ssm_state, conv_state, node_ssm, node_conv, accepted_last_node, cache_slot)
    return commit_tree_states_torch(ssm_state, conv_state, node_ssm, node_conv, accepted_last_node, cache_slot)


# ------------------------------------------------------------------------------------------------- memory


def _nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def per_node_state_bytes(H: int, K: int, V: int, conv_dim: int, K_conv: int,  # noqa: N803
                         dtype: torch.dtype = torch.float32, conv_dtype: torch.dtype | None = None) -> int:
    """Bytes one tree node costs in one recurrent layer: its SSM state (H value heads x V x K) and conv window."""
    conv_dtype = conv_dtype or dtype
    return H * V * K * _nbytes(dtype) + conv_dim * (K_conv - 1) * _nbytes(conv_dtype)


def max_budget_for_bytes(bytes_available: int, bytes_per_node: int, max_budget: int = MAX_TREE_NODES - 1) -> int:
    """Largest budget N with ``(N + 1) * bytes_per_node <= bytes_available``; -1 when not even the root fits.

    ``bytes_per_node`` is what one tree node costs across everything sized by the budget (all recurrent layers,
    all running requests). The engine-agnostic core of the start-up check: a serving engine that already knows
    its per-request state size (SGLang's ``mamba_cache_per_req``) calls this and :func:`check_budget_bytes`.
    """
    if bytes_per_node <= 0:
        raise ValueError(f"bytes_per_node must be positive, got {bytes_per_node}")
    return min(int(bytes_available) // int(bytes_per_node) - 1, max_budget)


def check_budget_bytes(budget: int, bytes_available: int, bytes_per_node: int, detail: str = "") -> None:
    """Raise ValueError naming the largest budget that fits when ``budget + 1`` nodes do not fit.

    ``detail`` says where ``bytes_per_node`` comes from (it is quoted in the message, e.g. "0.4 MiB per node per
    layer x 36 layers x 48 requests").
    """
    best = max_budget_for_bytes(bytes_available, bytes_per_node)
    if budget <= best:
        return
    need = (budget + 1) * bytes_per_node
    raise ValueError(
        f"DDTree budget {budget} needs {need / 2**30:.2f} GiB of per-node recurrent states "
        f"({bytes_per_node / 2**20:.3f} MiB per node{' = ' + detail if detail else ''} x {budget + 1} nodes) "
        f"but {bytes_available / 2**30:.2f} GiB are available; the largest budget that fits is {max(best, 0)}"
        + ("" if best >= 0 else " (not even the root fits)")
        + ". Lower the budget or the max running requests, or raise the memory fraction.")


def max_budget_for_memory(bytes_available: int, H: int, K: int, V: int, conv_dim: int, K_conv: int,  # noqa: N803
                          dtype: torch.dtype = torch.float32, *, num_layers: int = 1, batch: int = 1,
                          conv_dtype: torch.dtype | None = None, max_budget: int = MAX_TREE_NODES - 1) -> int:
    """Largest budget N (nodes excluding the root) whose per-node states fit in ``bytes_available``.

    Needs ``(N + 1) * per_node_state_bytes(...) * num_layers * batch <= bytes_available`` (``H`` = value heads,
    ``batch`` = max running requests). Returns -1 when not even the root fits, else a value in [0, max_budget].
    """
    per = per_node_state_bytes(H, K, V, conv_dim, K_conv, dtype, conv_dtype) * max(num_layers, 1) * max(batch, 1)
    return max_budget_for_bytes(bytes_available, per, max_budget)


def check_budget_memory(budget: int, bytes_available: int, H: int, K: int, V: int, conv_dim: int,  # noqa: N803
                        K_conv: int, dtype: torch.dtype = torch.float32, *, num_layers: int = 1, batch: int = 1,
                        conv_dtype: torch.dtype | None = None) -> None:
    """Raise ValueError with the numbers (the start-up error) when ``budget`` does not fit."""
    per = per_node_state_bytes(H, K, V, conv_dim, K_conv, dtype, conv_dtype)
    check_budget_bytes(budget, bytes_available, per * max(num_layers, 1) * max(batch, 1),
                       detail=f"{per / 2**20:.3f} MiB per node per layer x {num_layers} layers x {batch} requests")


def state_bytes_summary(budget: int, H: int, K: int, V: int, conv_dim: int, K_conv: int,  # noqa: N803
                        dtype: torch.dtype = torch.float32, conv_dtype: torch.dtype | None = None,
                        num_layers: int = 1) -> dict:
    """Numbers for docs and logs: bytes per node per layer and per request for this budget."""
    per = per_node_state_bytes(H, K, V, conv_dim, K_conv, dtype, conv_dtype)
    return {"per_node_per_layer": per, "per_request": per * (budget + 1) * num_layers,
            "per_request_gib": round(per * (budget + 1) * num_layers / 2**30, 3)}
