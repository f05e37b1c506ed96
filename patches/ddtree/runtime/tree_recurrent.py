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
   the request's cache slot, for the whole batch in one launch (:func:`commit_tree_states_layers`: for every
   recurrent layer of a pool at once, the layout of SGLang's ``MambaPool`` with its per-step scratch).

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
from .budget import (  # noqa: F401  (re-exported: the budget checks are part of this step's API)
    check_budget_bytes,
    check_budget_memory,
    max_budget_for_bytes,
    max_budget_for_memory,
    per_node_state_bytes,
)
from .tree_recurrent_ref import (  # noqa: F401
    MAX_TREE_NODES,
    check_parent_order,
    commit_tree_states_layers_torch,
    commit_tree_states_torch,
    tree_causal_conv1d_torch,
    tree_gated_delta_rule_torch,
)


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


def commit_tree_states_layers(ssm_pools: torch.Tensor, conv_pools: torch.Tensor, node_ssm: torch.Tensor,
                              node_conv: torch.Tensor, accepted_last_node: torch.Tensor, cache_slot: torch.Tensor,
                              impl: str = "auto"):
    """:func:`commit_tree_states` for all recurrent layers at once, in one launch.

    ``ssm_pools`` [L, slots, HV, V, K] and ``conv_pools`` [L, slots, D, >= K_conv-1] (SGLang's ``temporal`` and
    ``conv[0]``), ``node_ssm`` [L, rows, N1, HV, V, K] and ``node_conv`` [L, rows, N1, D, K_conv-1] with
    ``rows >= B`` (SGLang's ``intermediate_ssm`` / ``intermediate_conv_window[0]``, whose row b holds request b of
    the verify batch). Same skipping rules as :func:`commit_tree_states`. Returns ``(ssm_pools, conv_pools)``.
    """
    batch = accepted_last_node.shape[0]
    if cache_slot.shape != (batch,):
        raise ValueError("accepted_last_node and cache_slot must be [B]")
    if node_ssm.dim() != 6 or node_conv.dim() != 5 or ssm_pools.dim() != 5 or conv_pools.dim() != 4:
        raise ValueError("expected ssm_pools [L, slots, HV, V, K], conv_pools [L, slots, D, W], "
                         "node_ssm [L, rows, N1, HV, V, K], node_conv [L, rows, N1, D, W]")
    layers = node_ssm.shape[0]
    if not (ssm_pools.shape[0] == conv_pools.shape[0] == node_conv.shape[0] == layers):
        raise ValueError("all four tensors must have the same number of layers")
    if node_ssm.shape[1] < batch or node_conv.shape[1] < batch or node_ssm.shape[2] != node_conv.shape[2]:
        raise ValueError(f"node_ssm / node_conv need >= {batch} rows and the same N1")
    if tuple(node_ssm.shape[3:]) != tuple(ssm_pools.shape[2:]):
        raise ValueError("node_ssm [L, rows, N1, HV, V, K] must match ssm_pools [L, slots, HV, V, K]")
    if node_conv.shape[3] != conv_pools.shape[2] or conv_pools.shape[3] < node_conv.shape[4]:
        raise ValueError("node_conv [L, rows, N1, D, K_conv-1] must match conv_pools [L, slots, D, >= K_conv-1]")
    if use_triton(impl, ssm_pools, conv_pools, node_ssm, node_conv, accepted_last_node, cache_slot):
        from .tree_recurrent_triton import commit_tree_states_triton

        return commit_tree_states_triton(ssm_pools, conv_pools, node_ssm, node_conv, accepted_last_node,
                                         cache_slot, layered=True)
    return commit_tree_states_layers_torch(ssm_pools, conv_pools, node_ssm, node_conv, accepted_last_node,
                                           cache_slot)
