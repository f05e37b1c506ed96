"""KV compaction indices in plain torch: copy the accepted nodes' KV to the front of the verify range."""
from __future__ import annotations

import torch

from .types import WalkResult


def kv_compaction_torch(walk: WalkResult, verify_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) int64 [B, L+1]: src = slots of the accepted path, dst = the first accept_len + 1 slots."""
    nodes = walk.accepted_nodes.to(torch.int64)
    batch, width = nodes.shape
    slots = verify_slots.to(torch.int64)
    valid = nodes >= 0
    src = torch.where(valid, slots.gather(1, nodes.clamp(min=0)), -1)
    front = slots[:, :width]
    if front.shape[1] < width:  # budget < L: the path is at most N1 long anyway
        front = torch.cat([front, front.new_full((batch, width - front.shape[1]), -1)], 1)
    dst = torch.where(valid, front, -1)
    return src, dst
