"""The GatedDeltaNet tree verify in chunk form: every node's output from one read of the request's committed state,
with no state per node (Triton kernels in :mod:`.tree_chunk_triton`, plain-torch references in
:mod:`.tree_chunk_ref`; ``impl`` = "auto" | "triton" | "torch", as everywhere in the runtime).

:mod:`.tree_recurrent` keeps a full SSM state per node (HV x V x K floats per node and layer; 3 MiB at Qwen3.6-27B's
shape), so the budget is bounded by memory and the verify by writing those states. Unrolling the recurrence of
:mod:`.tree_recurrent` along a node's path (h0 the committed state, G_i the sum of the log decays g over node i's
ancestors and itself, kappa/q the normalised key/query, j < i meaning "j is a strict ancestor of i"):

    u_i = beta_i * (v_i - exp(G_i) h0 k_i - sum_{j < i} exp(G_i - G_j) (k_j . k_i) u_j)
    o_i = exp(G_i) h0 q_i + sum_{j <= i} exp(G_i - G_j) (k_j . q_i) u_j
    h_i = exp(G_i) h0 + sum_{j <= i} exp(G_i - G_j) u_j k_j^T

which is the gated delta rule's chunkwise (WY) form with the causal mask replaced by the ancestor mask: ancestors
precede their descendants in node order, so ``(I + A) u = rhs`` is unit lower triangular and each node's delta
depends only on its own ancestors. Three steps:

1. :func:`tree_ancestors` - the ancestor mask (int8 [B, N1, N1], self included) from the parents, once per round
   (every GDN layer of the round shares it).
2. :func:`tree_gated_delta_rule_chunk` - outputs o [B, N1, HV, V] and, per node and value head, a record of
   ``V + K + 1`` floats: the delta u_i, the normalised key k_i and the path log decay G_i (``records``
   [B, N1, HV, V + K + 1], float32; 257 floats against the 16384 of a state at K = V = 128).
3. :func:`commit_tree_records_layers` - the accepted node's state h_i, rebuilt from the committed state and the
   records of the <= L + 1 nodes on the accepted path, into a slot, for every layer in one launch (the source
   slot is read before the destination is written, per tile, so source and destination may be the same slot;
   a prefix-cache track slot must be committed before the request's own slot). :func:`commit_tree_conv_layers`
   copies the accepted node's conv windows (the conv step is :func:`.tree_recurrent.tree_causal_conv1d`, whose
   per-node windows are small: D x (K_conv - 1)).

Node layout, parents, slots (negative = padded request, committed state reads as zeros, never committed) and the
optional l2 normalisation are those of :mod:`.tree_recurrent`. The outputs equal the recurrent form's in exact
arithmetic; in floating point they differ by rounding (sums in another order), so a plain decode through this
form is not bit-identical to a tree verify through it, as it is for :mod:`.tree_recurrent`.
"""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .tree_chunk_ref import (  # noqa: F401  (re-exported: part of this step's API)
    commit_tree_conv_layers_torch,
    commit_tree_records_layers_torch,
    record_width,
    tree_ancestors_torch,
    tree_gdn_chunk_torch,
)


def tree_ancestors(parent: torch.Tensor) -> torch.Tensor:
    """``anc[b, i, j] = 1`` when node j is node i or an ancestor of it; int8 [B, N1, N1]. Torch ops only, no host
    synchronisation (a round computes it once, before the forward or its graph replay)."""
    return tree_ancestors_torch(parent)


def per_node_record_bytes(HV: int, K: int, V: int) -> int:  # noqa: N803
    """Bytes one tree node's record costs in one GDN layer (float32)."""
    return int(HV) * record_width(K, V) * 4


def tree_gated_delta_rule_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                beta: torch.Tensor, anc: torch.Tensor, ssm_state: torch.Tensor,
                                cache_slot: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                                records: torch.Tensor | None = None, impl: str = "auto"):
    """Tree GatedDeltaNet verify in chunk form. Returns ``(o [B, N1, HV, V] in q.dtype, records)``.

    ``anc`` from :func:`tree_ancestors`; ``records`` float32 [>= B, N1, HV, V + K + 1] may be preallocated (rows
    past B are left alone). Does not modify ``ssm_state``."""
    if use_triton(impl, q, k, v, g, beta, anc, ssm_state, cache_slot):
        from .tree_chunk_triton import tree_gdn_chunk_triton

        return tree_gdn_chunk_triton(q, k, v, g, beta, anc, ssm_state, cache_slot, scale, use_qk_l2norm, records)
    return tree_gdn_chunk_torch(q, k, v, g, beta, anc, ssm_state, cache_slot, scale, use_qk_l2norm, records)


def commit_tree_records_layers(ssm_pools: torch.Tensor, records: torch.Tensor, path: torch.Tensor,
                               steps: torch.Tensor, src_slot: torch.Tensor, dst_slot: torch.Tensor,
                               impl: str = "auto") -> torch.Tensor:
    """``ssm_pools[l, dst_slot[b]] = h`` of node ``path[b, steps[b]]``, for every layer l, in one launch.

    ``ssm_pools`` [L, slots, HV, V, K]; ``records`` [L, rows >= B, N1, HV, V + K + 1] (row b = request b of the
    verify batch); ``path`` [B, P] the accepted nodes root first (the runtime's ``WalkResult.accepted_nodes``);
    ``steps`` [B] the index along ``path`` of the node to commit; ``src_slot`` [B] the slot holding the state the
    verify started from. A request with a negative step or slot is skipped. Returns ``ssm_pools``."""
    if use_triton(impl, ssm_pools, records, path, steps, src_slot, dst_slot):
        from .tree_chunk_triton import commit_tree_records_layers_triton

        return commit_tree_records_layers_triton(ssm_pools, records, path, steps, src_slot, dst_slot)
    return commit_tree_records_layers_torch(ssm_pools, records, path, steps, src_slot, dst_slot)


def commit_tree_conv_layers(conv_pools: torch.Tensor, node_conv: torch.Tensor, accepted_last_node: torch.Tensor,
                            cache_slot: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """``conv_pools[l, cache_slot[b], :, :W] = node_conv[l, b, accepted_last_node[b]]`` for every layer, one launch
    (``conv_pools`` [L, slots, D, >= W], ``node_conv`` [L, rows >= B, N1, D, W]); negative slot or node: skipped."""
    batch = accepted_last_node.shape[0]
    if node_conv.dim() != 5 or conv_pools.dim() != 4 or node_conv.shape[1] < batch:
        raise ValueError(f"expected conv_pools [L, slots, D, W] and node_conv [L, rows >= {batch}, N1, D, W]")
    if (node_conv.shape[0] != conv_pools.shape[0] or node_conv.shape[3] != conv_pools.shape[2]
            or conv_pools.shape[3] < node_conv.shape[4] or cache_slot.shape != (batch,)):
        raise ValueError("node_conv [L, rows, N1, D, W] must match conv_pools [L, slots, D, >= W]; "
                         "cache_slot must be [B]")
    if use_triton(impl, conv_pools, node_conv, accepted_last_node, cache_slot):
        from .tree_chunk_triton import commit_tree_conv_layers_triton

        return commit_tree_conv_layers_triton(conv_pools, node_conv, accepted_last_node, cache_slot)
    return commit_tree_conv_layers_torch(conv_pools, node_conv, accepted_last_node, cache_slot)
