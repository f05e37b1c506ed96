"""The flat target-verify mask (layout in :mod:`.mask_ref`) written by one Triton launch, no host sync.

Grid = (B, N1, C): program (b, i, c) writes chunk ``c`` of row ``i`` of request ``b``. The last chunk index
(``c == C - 1``) writes the row's N1 tree columns; the others (only with context columns) write ``BLOCK``
context columns each as visible, masked to the request's own context length.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from .mask_ref import mask_offsets


@triton.jit
def _verify_mask_kernel(tree_ptr, prefix_ptr, start_ptr, out_ptr, N1: tl.constexpr, TB: tl.constexpr,
                        BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2)
    prefix = tl.load(prefix_ptr + b)
    row = tl.load(start_ptr + b) + i * (prefix + N1)
    if c == tl.num_programs(2) - 1:
        j = tl.arange(0, TB)
        inside = j < N1
        v = tl.load(tree_ptr + (b * N1 + i) * N1 + j, mask=inside, other=0)
        tl.store(out_ptr + row + prefix + j, v, mask=inside)
    else:
        cols = c * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + row + cols, tl.full([BLOCK], 1, tl.uint8), mask=cols < prefix)


def write_verify_mask_triton(tree_mask: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor, *,
                             prefix_cols: bool = False, max_prefix: int | None = None,
                             block: int = 1024) -> torch.Tensor:
    batch, n1, _ = tree_mask.shape
    if batch == 0:
        return out
    if prefix_cols and max_prefix is None:
        raise ValueError("prefix_cols=True needs max_prefix (a host upper bound of the context lengths)")
    prefix = prefix_lens.to(torch.int64).contiguous()
    start = mask_offsets(prefix, n1).contiguous()
    chunks = triton.cdiv(int(max_prefix), block) if prefix_cols else 0
    flat = out.view(-1).view(torch.uint8)
    tm = tree_mask.contiguous().view(torch.uint8)
    _verify_mask_kernel[(batch, n1, chunks + 1)](tm, prefix, start, flat, N1=n1, TB=next_pow2(n1), BLOCK=block)
    return out
