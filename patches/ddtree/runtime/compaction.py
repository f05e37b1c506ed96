"""Public entry: KV compaction indices (reference in :mod:`.compaction_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .compaction_ref import kv_compaction_torch
from .types import WalkResult


def kv_compaction(walk: WalkResult, verify_slots: torch.Tensor, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) int64 [B, L+1]: move the accepted path's KV to the first accept_len + 1 verify slots."""
    if use_triton(impl, walk.accepted_nodes, verify_slots):
        from .compaction_triton import kv_compaction_triton

        return kv_compaction_triton(walk, verify_slots)
    return kv_compaction_torch(walk, verify_slots)
