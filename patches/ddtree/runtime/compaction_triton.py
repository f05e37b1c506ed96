"""KV compaction indices as one small Triton program per request (a gather of the accepted path's slots)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from .types import WalkResult


@triton.jit
def _compaction_kernel(nodes_ptr, slots_ptr, src_ptr, dst_ptr, N1, WIDTH, WP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, WP)
    inside = t < WIDTH
    node = tl.load(nodes_ptr + b * WIDTH + t, mask=inside, other=-1)
    ok = node >= 0
    src = tl.load(slots_ptr + b * N1 + node, mask=ok, other=-1)
    dst = tl.load(slots_ptr + b * N1 + t, mask=ok & (t < N1), other=-1)
    tl.store(src_ptr + b * WIDTH + t, tl.where(ok, src, -1), mask=inside)
    tl.store(dst_ptr + b * WIDTH + t, tl.where(ok, dst, -1), mask=inside)


def kv_compaction_triton(walk: WalkResult, verify_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, width = walk.accepted_nodes.shape
    n1 = verify_slots.shape[1]
    src = torch.empty((batch, width), device=verify_slots.device, dtype=torch.int64)
    dst = torch.empty_like(src)
    _compaction_kernel[(batch,)](walk.accepted_nodes.contiguous(), verify_slots.to(torch.int64).contiguous(),
                                 src, dst, n1, width, WP=next_pow2(width), num_warps=1)
    return src, dst
