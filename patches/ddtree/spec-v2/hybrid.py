"""DDTree on hybrid GatedDeltaNet targets (Qwen3.5 / Qwen3.6, Qwen3-Next) on SGLang 0.5.17's spec-v2 worker.

For attention layers a draft tree is only a mask. A GatedDeltaNet layer needs, for every tree node, the conv window
and SSM state of the node's own root->node path, and after the walk the state of the last accepted node must become
the request's. SGLang's own path for this (EAGLE topk > 1) derives parents from first-child / next-sibling links
scanning the whole batch's tokens and unrolls its tree conv over the verify width (compile time grows with the
budget), and 0.5.17's chain layout of the conv scratch (one shared sliding window per request) is wrong for trees.
So DDTree runs the layers' TARGET_VERIFY through the DDTree runtime's own kernels instead:

* :meth:`TreeVerify.forward` (patch 0004 calls it from ``GDNAttnBackend.forward_extend`` in TARGET_VERIFY):
  ``tree_causal_conv1d`` then the gated delta rule with per-request local parent indices, reading the committed
  conv window / SSM state from the pool by the request's mamba slot and writing every node's window, and its
  record (chunk form, the default: ``tree_gated_delta_rule_chunk``, V + K + 1 floats per value head) or its state
  (``DDTREE_GDN_VERIFY=recurrent``: ``tree_gated_delta_rule``), where the base keeps its per-step intermediates
  (``intermediate_conv_window[0]`` / ``intermediate_ssm``, row b = request b of the verify batch, step i = node i;
  patch 0004 has the base allocate ``intermediate_ssm`` in the form's layout, :func:`intermediate_ssm_layout`).
  Nothing in the pool is modified.
* The parent indices live in one fixed buffer per backend (``TreeVerify.parent``), filled from the round's tree
  when the backend prepares the forward (``init_forward_metadata`` eagerly, ``init_forward_metadata_out_graph``
  before a CUDA-graph replay): the captured verify graph reads them in place. Rows of padded requests keep stale
  (still parent-before-child) or root-only (-1) rows; their results are never committed (slot -1).
* :func:`commit` (patch 0004 calls it from the worker's ``_update_target_mamba_state_after_verify``): the accepted
  node's state (chunk form: rebuilt from the committed state and the path's records, ``commit_tree_records_layers``;
  recurrent: copied, ``commit_tree_states_layers``) and window of every layer go into the request's slot, one
  launch each, in place of the chain's scatter of step ``commit_lens - 1``; the base's
  prefix-cache tracking rule (which step along the committed path is saved into ``mamba_track_indices``, the
  ``extra_buffer`` strategy's track slot) is computed by the base as for the chain and mapped to the node on the
  path, then committed the same way.
* :func:`target_problems` refuses at start-up what this does not cover, each with the reason, and
  :func:`check_memory_for_pool` (patch 0004 calls it where the base sizes the mamba pool) refuses a budget whose
  per-node scratch does not fit, naming the largest that does, and returns the per-node bytes the base reserves.

Compile cost does not grow with the budget: the conv kernel unrolls over the conv width only; the GDN kernel loops
over the nodes (one compile per verify width, seconds).
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Optional

import torch

from .bases import with_trait
from .config import resolved

logger = logging.getLogger(__name__)

#: The largest budget the runtime's tree kernels take (verify width 1025); memory is the practical bound.
MAX_HYBRID_BUDGET = 1024
#: Linear-attention backend classes of SGLang 0.5.17 -> the family they serve (for the refusal message).
OTHER_FAMILIES = {
    "Mamba2AttnBackend": "Mamba2 (Nemotron-H, Falcon-H1, ...)",
    "LightningAttentionBackend": "lightning attention (seg_la)",
    "KDAAttnBackend": "Kimi delta attention (KDA, Kimi-Linear)",
    "ShortConvAttnBackend": "short convolution (LFM2, ZAYA1)",
}
#: ``DDTREE_HYBRID_IMPL``: the runtime's kernel choice ("auto": Triton on CUDA; the CPU tests force "triton").
IMPL_ENV = "DDTREE_HYBRID_IMPL"
#: ``DDTREE_GDN_VERIFY``: the GatedDeltaNet verify. "chunk" (default): the chunk form of ``ddtree/tree_chunk.py``,
#: a record of V + K + 1 floats per node and value head, the accepted state rebuilt at commit. "recurrent": the
#: per-node recurrence of ``ddtree/tree_recurrent.py``, a full state per node (budgets bounded by memory), kept
#: because plain decoding through it is bit-identical to a tree verify through it (the ``ard`` reference).
GDN_VERIFY_ENV = "DDTREE_GDN_VERIFY"
GDN_VERIFY_MODES = ("chunk", "recurrent")


def _rt():
    from .draft_topk import runtime

    return runtime()


def _impl() -> str:
    return os.environ.get(IMPL_ENV, "auto")


def gdn_verify_mode() -> str:
    """``DDTREE_GDN_VERIFY`` ("chunk" unless set); anything else is refused, naming the variable."""
    mode = os.environ.get(GDN_VERIFY_ENV, "chunk").strip() or "chunk"
    if mode not in GDN_VERIFY_MODES:
        raise ValueError(f"{GDN_VERIFY_ENV}={mode!r}: must be one of {', '.join(GDN_VERIFY_MODES)}")
    return mode


def ddtree_budget(server_args: Any) -> Optional[int]:
    value = getattr(server_args, "speculative_ddtree_budget", None)
    return None if value is None else int(value)


def conv_window_dedup_allowed() -> bool:
    """0.5.17 shares one sliding conv window per request across the verify steps (a chain's layout); tree nodes
    need a window each, so the dense layout is kept whenever DDTree is on (patch 0004, ``MambaPool``)."""
    from sglang.srt.runtime_context import get_spec

    return ddtree_budget(get_spec()) is None


def intermediate_ssm_layout(size: tuple, dtype: torch.dtype) -> tuple[tuple, torch.dtype]:
    """Shape and dtype of the base's per-step SSM scratch (patch 0004, ``MambaPool``): unchanged with DDTree off
    or in "recurrent" mode; in "chunk" mode one float32 record per node and value head,
    [layers, rows, N1, HV, V + K + 1] in place of [layers, rows, N1, HV, V, K]."""
    from sglang.srt.runtime_context import get_spec

    if ddtree_budget(get_spec()) is None or gdn_verify_mode() != "chunk":
        return tuple(size), dtype
    layers, rows, n1, hv, vdim, kdim = size
    return (layers, rows, n1, hv, _rt().record_width(kdim, vdim)), torch.float32


# ------------------------------------------------------------------------------------------------- verify


class TreeVerify:
    """The TARGET_VERIFY forward of one GDN backend's layers through the runtime's tree kernels."""

    def __init__(self, n1: int, rows: int, device: Any, mode: str = "chunk"):
        self.n1 = int(n1)
        self.mode = mode
        self.parent = torch.full((int(rows), self.n1), -1, dtype=torch.int32, device=device)
        # chunk form: the ancestor mask of every row, refreshed with the parents (one per round for all layers), kept
        # in float32 so that no layer converts it again for its decay matmul
        self.anc = _rt().tree_ancestors(self.parent).to(torch.float32) if mode == "chunk" else None

    @classmethod
    def attach(cls, backend: Any, model_runner: Any) -> Optional["TreeVerify"]:
        """The tree verify of a target's GDN backend, or None (DDTree off, or the draft model's backend)."""
        args = model_runner.server_args
        if ddtree_budget(args) is None or getattr(model_runner, "is_draft_worker", False):
            return None
        rows = len(backend.verify_intermediate_state_indices)  # the base's padded maximum verify batch
        return cls(int(args.speculative_num_draft_tokens), rows, model_runner.device, gdn_verify_mode())

    def fill(self, forward_batch: Any) -> None:
        """Copy the round's parents into the fixed buffer (before an eager forward or a graph replay)."""
        if not forward_batch.forward_mode.is_target_verify():
            return
        tree = getattr(forward_batch.spec_info, "tree", None)
        if tree is None:  # graph capture and the base's dummy runs: a chain-shaped verify input without a tree
            return
        parent = tree.parent
        if parent.shape[1] != self.n1 or parent.shape[0] > self.parent.shape[0]:
            raise RuntimeError(f"DDTree hybrid verify: a tree of {tuple(parent.shape)} does not fit the parent "
                               f"buffer {tuple(self.parent.shape)}")
        self.parent[: parent.shape[0]].copy_(parent)
        if self.anc is not None:
            self.anc[: parent.shape[0]].copy_(_rt().tree_ancestors(self.parent[: parent.shape[0]]))

    def forward(self, backend: Any, layer: Any, forward_batch: Any, mixed_qkv: torch.Tensor, a: torch.Tensor,
                b: torch.Tensor) -> torch.Tensor:
        """One GDN layer's TARGET_VERIFY: tree conv1d, gating, tree gated delta rule; output [1, T, HV, V]."""
        impl = _impl()
        n1 = self.n1
        tokens = mixed_qkv.shape[0]
        batch = tokens // n1
        cache = backend.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        node_ssm_all = cache.intermediate_ssm
        node_conv_all = cache.intermediate_conv_window[0]
        if batch > node_ssm_all.shape[0]:
            raise RuntimeError(f"DDTree hybrid verify: batch {batch} exceeds the {node_ssm_all.shape[0]} rows of "
                               "per-node state scratch")
        slots = backend.forward_metadata.mamba_cache_indices[:batch]
        per_node = dict(records=node_ssm_all[:batch], anc=self.anc[:batch]) if self.anc is not None else dict(
            node_ssm=node_ssm_all[:batch])
        o = tree_layer(layer, mixed_qkv.view(batch, n1, -1), a, b, self.parent[:batch], cache.conv[0], cache.temporal,
                       slots, node_conv=node_conv_all[:batch], impl=impl, **per_node)
        return o.view(1, tokens, layer.num_v_heads, layer.head_v_dim)


def tree_layer(layer: Any, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, parent: torch.Tensor,
               conv_state: torch.Tensor, ssm_state: torch.Tensor, slots: torch.Tensor, *,
               node_conv: Optional[torch.Tensor] = None, node_ssm: Optional[torch.Tensor] = None,
               records: Optional[torch.Tensor] = None, anc: Optional[torch.Tensor] = None,
               impl: str = "auto") -> torch.Tensor:
    """One GDN layer over trees ``x`` [B, N1, conv dim] from the committed states at ``slots``: tree conv1d, gating,
    tree gated delta rule; every node's window into ``node_conv``; output [B, N1, HV, V]. With ``records`` (the
    chunk form; ``anc`` the rows' ancestor masks, computed from ``parent`` when None) every node's record goes
    there, otherwise (the recurrent form) every node's state into ``node_ssm``. The verify's math, in one place
    (bench/e2e's plain-decoding reference runs it as 1-node trees)."""
    rt = _rt()
    batch, n1 = x.shape[:2]
    y, _ = rt.tree_causal_conv1d(x, parent, conv_state, slots, layer.conv_weights, layer.bias, layer.activation,
                                 node_conv=node_conv, impl=impl)
    q_end, k_end = layer.q_dim, layer.q_dim + layer.k_dim
    q = y[..., :q_end].unflatten(-1, (layer.num_q_heads, layer.head_q_dim))
    k = y[..., q_end:k_end].unflatten(-1, (layer.num_k_heads, layer.head_k_dim))
    v = y[..., k_end:].unflatten(-1, (layer.num_v_heads, layer.head_v_dim))
    g, beta = gdn_gating(layer.A_log, a, b, layer.dt_bias)
    if records is not None:
        o, _ = rt.tree_gated_delta_rule_chunk(q, k, v, g.view(batch, n1, -1), beta.view(batch, n1, -1),
                                              rt.tree_ancestors(parent) if anc is None else anc, ssm_state, slots,
                                              scale=layer.head_k_dim ** -0.5, use_qk_l2norm=True, records=records,
                                              impl=impl)
        return o
    o, _ = rt.tree_gated_delta_rule(q, k, v, g.view(batch, n1, -1), beta.view(batch, n1, -1), parent, ssm_state,
                                    slots, scale=layer.head_k_dim ** -0.5, use_qk_l2norm=True, node_ssm=node_ssm,
                                    impl=impl)
    return o


def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor,  # noqa: N803
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g = -exp(A_log) * softplus(a + dt_bias) (threshold 20) and beta = sigmoid(b), fp32 [T, HV]: the base's
    ``fused_gdn_gating`` kernel on CUDA, the same math in torch elsewhere."""
    if a.is_cuda:
        from sglang.kernels.ops.attention.fla.fused_gdn_gating import fused_gdn_gating

        g, beta = fused_gdn_gating(A_log, a, b, dt_bias)
        return g.view(a.shape[0], -1), beta.view(a.shape[0], -1)
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * torch.where(x <= 20.0, torch.log1p(torch.exp(x)), x)
    return g, torch.sigmoid(b.float())


# ------------------------------------------------------------------------------------------------- commit


def path_nodes(steps: torch.Tensor, accepted_nodes: torch.Tensor) -> torch.Tensor:
    """Steps along each request's committed path (0 = root; negative = none) -> tree node indices (-1 = none).

    ``accepted_nodes`` [B, L+1]: root first, then the accepted path (the runtime's ``WalkResult``). The chain's
    intermediate states are indexed by step; a tree's by node, so the index is the node at that step."""
    steps = steps.to(torch.int64)
    nodes = accepted_nodes.to(torch.int64).gather(1, steps.clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(steps >= 0, nodes, torch.full_like(nodes, -1))


def commit(attn_backend: Any, *, last_correct_step_indices: torch.Tensor, mamba_track_indices: Optional[torch.Tensor],
           mamba_steps_to_track: Optional[torch.Tensor], accepted_nodes: torch.Tensor) -> None:
    """The accepted node's conv window and SSM state of every GDN layer into each request's slot (and, for the
    base's prefix-cache tracking, the node at the tracked step into the track slot), one launch each. In chunk
    mode the states are rebuilt from the committed state and the path's records, the track slot first (it reads
    the request's slot before that is overwritten)."""
    rt = _rt()
    linear = attn_backend.linear_attn_backend
    n = last_correct_step_indices.shape[0]
    slots = linear.forward_metadata.mamba_cache_indices[:n]
    caches = linear.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    if getattr(linear.ddtree, "mode", "recurrent") == "chunk":
        path = accepted_nodes[:n]
        conv, node_conv, impl = caches.conv[0], caches.intermediate_conv_window[0], _impl()
        if mamba_track_indices is not None and mamba_steps_to_track is not None:
            track = mamba_track_indices[:n]
            rt.commit_tree_records_layers(caches.temporal, caches.intermediate_ssm, path, mamba_steps_to_track[:n],
                                          slots, track, impl=impl)
            rt.commit_tree_conv_layers(conv, node_conv, path_nodes(mamba_steps_to_track[:n], path), track, impl=impl)
        rt.commit_tree_records_layers(caches.temporal, caches.intermediate_ssm, path, last_correct_step_indices,
                                      slots, slots, impl=impl)
        rt.commit_tree_conv_layers(conv, node_conv, path_nodes(last_correct_step_indices, path), slots, impl=impl)
        return
    pools = (caches.temporal, caches.conv[0], caches.intermediate_ssm, caches.intermediate_conv_window[0])
    rt.commit_tree_states_layers(*pools, path_nodes(last_correct_step_indices, accepted_nodes[:n]), slots,
                                 impl=_impl())
    if mamba_track_indices is not None and mamba_steps_to_track is not None:
        track_nodes = path_nodes(mamba_steps_to_track, accepted_nodes[:n])
        rt.commit_tree_states_layers(*pools, track_nodes, mamba_track_indices[:n], impl=_impl())


# ------------------------------------------------------------------------------------------------- start-up


def target_problems(model_runner: Any) -> list[str]:
    """What keeps DDTree from branching this hybrid target's recurrent state, each with the reason (empty: ok)."""
    backend = model_runner.attn_backend
    linear = getattr(backend, "linear_attn_backend", None)
    if linear is None:
        return [f"the hybrid attention backend {type(backend).__name__} (no linear-attention backend to branch)"]
    name = type(linear).__name__
    if not _is_gdn(linear):
        family = OTHER_FAMILIES.get(name, "linear-attention")
        return [f"{family} layers ({name}): DDTree branches the recurrent state of GatedDeltaNet layers only"]
    if not hasattr(linear, "ddtree"):
        return [f"hybrid GatedDeltaNet targets on this SGLang ({name}): DDTree branches their recurrent state on "
                f"SGLang {' / '.join(with_trait('hybrid'))} only (their patch 0004)"]
    problems = []
    if linear.ddtree is None:
        problems.append("a GDN backend built without DDTree's tree verify (the patch set is incomplete)")
    dispatcher = linear.kernel_dispatcher
    kernels = {role: type(getattr(dispatcher, f"{role}_kernel", None)).__name__
               for role in ("decode", "extend", "verify")}
    if getattr(dispatcher, "verify_kernel_is_flashinfer", False) or any(k != "TritonGDNKernel"
                                                                         for k in kernels.values()):
        problems.append("GatedDeltaNet kernels other than triton (" + ", ".join(f"{r}={k}" for r, k in kernels.items())
                        + "): FlashInfer / CuTe DSL keep their states in layouts and dtypes the tree kernels do not "
                        "read; use --linear-attn-backend triton without --linear-attn-decode-backend / "
                        "--linear-attn-prefill-backend")
    pool = getattr(model_runner.req_to_token_pool, "mamba_pool", None)
    if getattr(pool, "enable_linear_replayssm", False) or getattr(pool, "enable_linear_replayssm_spec", False):
        problems.append("ReplaySSM (--enable-linear-replayssm / --enable-linear-replayssm-spec): its state is a "
                        "checkpoint plus a chain-shaped ring, not a state per tree node")
    cache = getattr(pool, "mamba_cache", None)
    if cache is not None:
        if getattr(cache, "intermediate_ssm", None) is None:
            problems.append("a mamba pool without per-step intermediate states")
        elif getattr(linear.ddtree, "mode", None) == "chunk" and (
                cache.intermediate_ssm.dim() != 5 or cache.intermediate_ssm.dtype != torch.float32
                or cache.intermediate_ssm.shape[-1] != _rt().record_width(cache.temporal.shape[-1],
                                                                          cache.temporal.shape[-2])):
            problems.append(f"per-step SSM scratch {tuple(cache.intermediate_ssm.shape)} "
                            f"{cache.intermediate_ssm.dtype} is not the chunk verify's per-node records (patch "
                            f"0004's MambaPool hook; {GDN_VERIFY_ENV}=recurrent keeps a state per node)")
        elif len(cache.conv) != 1:
            problems.append(f"{len(cache.conv)} conv state types per layer (GatedDeltaNet has one)")
        else:
            win = cache.intermediate_conv_window[0]
            if win.stride(-1) == win.stride(2) or win.shape[2] != int(resolved(model_runner.server_args).speculative_num_draft_tokens):
                problems.append("the shared sliding-window conv scratch (a chain's layout; patch 0004 keeps one "
                                "window per node when DDTree is on)")
            temporal = cache.temporal
            inner = tuple(torch.empty(temporal.shape[2:], device="meta").stride())
            if tuple(temporal.stride()[2:]) != inner:
                problems.append("a page-major mamba state layout (--enable-page-major-kv-layout): the tree kernels "
                                "need each slot's SSM state contiguous")
    return problems


def _is_gdn(linear: Any) -> bool:
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    return isinstance(linear, GDNAttnBackend)


def node_bytes_per_req(per_req_bytes: int, cache_params: Any = None, layer_scale: float = 1.0) -> int:
    """Bytes of per-step scratch one tree node costs per request, all recurrent layers of this stage: the base's
    ``mamba_cache_per_req`` (a full state and conv window per node) in "recurrent" mode or without the pool's
    parameters; in "chunk" mode the conv windows plus one record of V + K + 1 floats per value head."""
    if cache_params is None or gdn_verify_mode() != "chunk":
        return int(per_req_bytes)
    hv, vdim, kdim = (int(x) for x in cache_params.shape.temporal)
    conv = sum(math.prod(int(d) for d in shape) for shape in cache_params.shape.conv) * cache_params.dtype.conv.itemsize
    per_layer = conv + _rt().per_node_record_bytes(hv, kdim, vdim)
    return int(per_layer * len(cache_params.layers) * layer_scale)


def max_budget(*, total_rest_gib: float, per_req_bytes: int, max_running_requests: int, slots_per_req: int = 1,
               mamba_share: float = 1.0, node_bytes: Optional[int] = None) -> tuple[int, int, int]:
    """(largest budget that fits, bytes available for per-node scratch, bytes per tree node) for the base's pool.

    The base reserves ``node_bytes x (requests + 1) x verify width`` bytes of per-step scratch (patch 0004:
    ``node_bytes`` = :func:`node_bytes_per_req`, ``per_req`` when not given) next to the requests' own states
    (``per_req x (requests x slots_per_req + 1)``; ``slots_per_req`` > 1 under the ``extra_buffer`` strategy),
    out of ``total_rest_gib x mamba_share`` (the share its ratio-based sizing gives the mamba pool; 1 when sizes
    are explicit). DDTree's verify width is budget + 1."""
    rt = _rt()
    reqs = max(int(max_running_requests), 1)
    per_node = int(per_req_bytes if node_bytes is None else node_bytes) * (reqs + 1)
    own = int(per_req_bytes) * (reqs * max(int(slots_per_req), 1) + 1)
    available = int(float(total_rest_gib) * mamba_share * (1 << 30)) - own
    return rt.max_budget_for_bytes(max(available, 0), per_node, MAX_HYBRID_BUDGET), available, per_node


def check_memory(*, budget: int, total_rest_gib: float, per_req_bytes: int, max_running_requests: int,
                 slots_per_req: int = 1, mamba_share: float = 1.0, node_bytes: Optional[int] = None) -> int:
    """Raise ValueError when ``budget + 1`` nodes' scratch does not fit, naming the largest budget that does;
    returns that largest budget."""
    rt = _rt()
    best, available, per_node = max_budget(total_rest_gib=total_rest_gib, per_req_bytes=per_req_bytes,
                                           max_running_requests=max_running_requests, slots_per_req=slots_per_req,
                                           mamba_share=mamba_share, node_bytes=node_bytes)
    reqs = max(int(max_running_requests), 1)
    what = ("conv windows + chunk records" if node_bytes is not None and node_bytes != per_req_bytes
            else "conv + SSM state")
    node = per_req_bytes if node_bytes is None else node_bytes
    try:
        rt.check_budget_bytes(int(budget), max(available, 0), per_node,
                              detail=(f"{node / 2**20:.3f} MiB of {what} per node per request (all recurrent "
                                      f"layers) x ({reqs} max running requests + 1)"))
    except ValueError as exc:
        raise ValueError(f"DDTree on a hybrid target (--speculative-ddtree-budget): {exc} "
                         "(--max-running-requests lowers the per-node cost)") from None
    return best


def check_memory_for_pool(configurator: Any, total_rest_gib: float, per_req_bytes: int, cache_params: Any = None,
                          layer_scale: float = 1.0) -> int:
    """The start-up check where SGLang sizes the mamba pool (``KVCacheConfigurator._handle_max_mamba_cache``, patch
    0004), with the share and request count that sizing uses. Returns the bytes of per-step scratch per request and
    verify step that the base then reserves (:func:`node_bytes_per_req`; ``per_req_bytes`` with DDTree off)."""
    from sglang.srt.runtime_context import get_memory, get_schedule, get_spec

    budget = ddtree_budget(get_spec())
    if budget is None:
        return int(per_req_bytes)
    node_bytes = node_bytes_per_req(per_req_bytes, cache_params, layer_scale)
    sched = get_schedule()
    auto_fit = sched.max_mamba_cache_size is None and not (get_memory().disable_radix_cache
                                                           and sched.max_running_requests is not None)
    share = sched.mamba_full_memory_ratio / (1 + sched.mamba_full_memory_ratio) if auto_fit else 1.0
    reqs = sched.max_running_requests // max(int(configurator.ps.attn_dp_size), 1)
    best = check_memory(budget=budget, total_rest_gib=total_rest_gib, per_req_bytes=per_req_bytes,
                        max_running_requests=reqs, slots_per_req=configurator._calculate_mamba_ratio(),
                        mamba_share=share, node_bytes=node_bytes)
    logger.info("DDTree hybrid (%s GDN verify): budget %d fits the per-node scratch, %.3f MiB per node per request "
                "(largest that fits: %d at %d max running requests).", gdn_verify_mode(), budget, node_bytes / 2**20,
                best, reqs)
    return node_bytes
