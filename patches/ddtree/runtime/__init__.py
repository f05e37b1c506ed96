"""DDTree runtime: GPU tree build, verify inputs, acceptance walk, KV compaction and recurrent-state branching
(hybrid GatedDeltaNet layers) for a whole batch.

Every step has a Triton kernel (``*_triton.py``) and a plain-torch reference (``*_ref.py``); the public
functions pick one with ``impl`` ("auto" = triton on CUDA tensors when triton imports). No step synchronises
with the host on the triton path, so a full round can be captured in a CUDA graph.
Relocatable: relative imports only; vendored into SGLang as ``sglang/srt/speculative/ddtree/``.
Contract: docs/runtime-api.md.
"""
from __future__ import annotations

from .commit import gather_path, path_first_slot_order
from .compaction import kv_compaction
from .kv_move import KVRows, move_path_kv
from .mask import mask_numel, mask_offsets, write_verify_mask
from .selftest import self_test
from .topk import draft_topk, topk_logits_lse
from .tree import build_tree, prune_tree
from .tree_attn import tree_verify_attention
from .tree_chunk import (
    commit_tree_conv_layers,
    commit_tree_records_layers,
    per_node_record_bytes,
    record_width,
    tree_ancestors,
    tree_gated_delta_rule_chunk,
)
from .tree_recurrent import (
    check_budget_bytes,
    check_budget_memory,
    check_parent_order,
    commit_tree_states,
    commit_tree_states_layers,
    max_budget_for_bytes,
    max_budget_for_memory,
    per_node_state_bytes,
    tree_causal_conv1d,
    tree_gated_delta_rule,
)
from ._version import __version__
from .types import DraftTree, VerifyInputs, WalkResult
from .verify import build_verify_inputs
from .walk import accept_walk, sample_target_tokens


__all__ = [
    "DraftTree",
    "KVRows",
    "VerifyInputs",
    "WalkResult",
    "__version__",
    "accept_walk",
    "build_tree",
    "build_verify_inputs",
    "check_budget_bytes",
    "check_budget_memory",
    "check_parent_order",
    "commit_tree_conv_layers",
    "commit_tree_records_layers",
    "commit_tree_states",
    "commit_tree_states_layers",
    "draft_topk",
    "topk_logits_lse",
    "gather_path",
    "kv_compaction",
    "mask_numel",
    "mask_offsets",
    "move_path_kv",
    "max_budget_for_bytes",
    "max_budget_for_memory",
    "path_first_slot_order",
    "prune_tree",
    "per_node_record_bytes",
    "per_node_state_bytes",
    "record_width",
    "sample_target_tokens",
    "self_test",
    "tree_ancestors",
    "tree_causal_conv1d",
    "tree_gated_delta_rule",
    "tree_gated_delta_rule_chunk",
    "tree_verify_attention",
    "write_verify_mask",
]
