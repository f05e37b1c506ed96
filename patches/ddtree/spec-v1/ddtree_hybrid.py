"""DDTree on hybrid targets (GatedDeltaNet linear-attention layers between attention layers).

For attention layers a draft tree is only a mask. A recurrent layer needs, for every tree node, the
conv window and SSM state of the node's own root->node path, and after acceptance the state of the
last accepted node must become the request's state. SGLang 0.5.11 already has tree-aware kernels
for this (EAGLE topk > 1): `causal_conv1d_update` with `retrieve_next_token/_sibling` (it also writes
`retrieve_parent_token`) and the GDN verify kernel that starts every node from its parent's cached
intermediate state. DDTree turns that path on (`MambaAttnBackendBase.tree_verify`), hands the kernels
its tree as first-child / next-sibling arrays, and commits the intermediate state of each request's
last accepted *node* (not chain step) with the base's fused scatter.

This module holds the two start-up checks: which linear backends are supported, and whether the
per-node intermediate states of the budget fit in memory.
"""

from __future__ import annotations

from typing import Optional

import torch


def _linear_backend(attn_backend):
    """The linear-attention sub-backend of a hybrid backend, or None for a plain attention target."""
    if not hasattr(attn_backend, "update_mamba_state_after_mtp_verify"):
        return None
    return getattr(attn_backend, "linear_attn_backend", None)


# The base's tree conv1d kernel unrolls its per-node loop over the verify width (tl.static_range), so
# its compile time grows steeply with the tree: measured for sm_90 ~3 s at 16 nodes, ~24 s at 65,
# ~88 s at 129, ~570 s at 257. Beyond this budget the first verify (or graph capture) would stall for
# many minutes per width, so hybrid targets are refused above it.
MAX_HYBRID_BUDGET = 128


def check_ddtree_hybrid_backend(attn_backend, budget: Optional[int] = None) -> Optional[str]:
    """Raise ValueError unless DDTree can verify a tree through this target's recurrent layers.

    Returns the linear backend's class name for hybrid targets (None for attention-only targets).
    Supported: GatedDeltaNet layers (`GDNAttnBackend`) with the triton verify kernel, budget <=
    MAX_HYBRID_BUDGET. Mamba2 and the other linear-attention families are refused: their tree paths
    are untested with DDTree.
    """
    linear = _linear_backend(attn_backend)
    if linear is None:
        if hasattr(attn_backend, "update_mamba_state_after_mtp_verify"):
            raise ValueError(
                "DDTree (--speculative-ddtree-budget): hybrid attention backend "
                f"{type(attn_backend).__name__} has no linear_attn_backend; unsupported."
            )
        return None
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    name = type(linear).__name__
    if not isinstance(linear, GDNAttnBackend):
        raise ValueError(
            "DDTree (--speculative-ddtree-budget) supports hybrid targets with GatedDeltaNet "
            f"layers (GDNAttnBackend) only; this target's linear-attention backend is {name}. "
            "Serve it with DFLASH's chain (drop --speculative-ddtree-budget)."
        )
    if not getattr(linear, "tree_verify", False):
        raise RuntimeError(
            "DDTree: the hybrid linear-attention backend was built without tree verify "
            "(MambaAttnBackendBase.tree_verify is False); the DDTree patch set is incomplete."
        )
    if budget is not None and int(budget) > MAX_HYBRID_BUDGET:
        raise ValueError(
            f"DDTree budget {budget} is too large for a hybrid target: SGLang's tree-aware conv1d "
            "kernel is unrolled over the tree's nodes and would take many minutes to compile "
            f"(about 1.5 min at budget 128, 10 min at 256). Use --speculative-ddtree-budget <= "
            f"{MAX_HYBRID_BUDGET} with GatedDeltaNet targets."
        )
    verify_kernel = type(linear.kernel_dispatcher.verify_kernel).__name__
    if verify_kernel != "TritonGDNKernel":
        raise ValueError(
            "DDTree (--speculative-ddtree-budget) on GatedDeltaNet layers needs the triton "
            f"verify kernel (tree-aware), but the GDN verify kernel is {verify_kernel}. "
            "Use --linear-attn-backend triton (and no flashinfer "
            "--linear-attn-decode-backend / --linear-attn-prefill-backend)."
        )
    return name


def check_ddtree_hybrid_memory(
    *,
    budget: int,
    total_rest_gib: float,
    state_bytes_per_req: int,
    max_running_requests: int,
) -> int:
    """Start-up check that the budget's per-node recurrent states fit; returns the largest budget that fits.

    SGLang reserves `mamba_cache_per_req x max_running_requests x verify_width` bytes of intermediate
    states for speculative decoding, and DDTree's verify width is budget + 1, so the reservation grows
    with the budget. `total_rest_gib` is the memory left after the weights (before that reservation);
    what must remain is at least the running requests' own states (`state_bytes_per_req` each). Raises
    ValueError naming the largest budget that fits when the budget does not.
    """
    from sglang.srt.speculative.ddtree import check_budget_bytes, max_budget_for_bytes

    mrr = max(int(max_running_requests), 1)
    per_node = int(state_bytes_per_req) * mrr
    available = int(total_rest_gib * (1 << 30)) - per_node  # the requests' own states
    check_budget_bytes(
        int(budget),
        available,
        per_node,
        detail=(
            f"{state_bytes_per_req / 2**20:.3f} MiB of conv + SSM state per request "
            f"(all recurrent layers) x {mrr} max running requests"
        ),
    )
    return max_budget_for_bytes(available, per_node)


def path_steps_to_nodes(steps: torch.Tensor, accepted_nodes: torch.Tensor) -> torch.Tensor:
    """Map steps along each request's committed path to tree node indices (no host sync).

    `steps` int [bs]: 0 = the root, i = the i-th accepted draft; negative = skip (kept as is).
    `accepted_nodes` int [bs, L+1]: root first, then the accepted path (the runtime's WalkResult).
    The chain commit uses the step itself as the intermediate-state index; a tree's intermediate
    states are per node, so the index is the node on the path at that step.
    """
    nodes = accepted_nodes.to(torch.int64).gather(
        1, steps.to(torch.int64).clamp(min=0).unsqueeze(1)
    ).squeeze(1)
    return torch.where(steps >= 0, nodes, steps.to(torch.int64))
