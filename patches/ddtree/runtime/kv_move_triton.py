"""Moving the accepted path's KV rows into place in one launch for every layer (reference and why the order matters:
:mod:`.kv_move_ref`).

Grid = requests x buffers x row chunks; a program walks its request's path columns in order, copying its chunk of
each row, so the order the reference keeps holds within every (buffer, chunk), and programs never share a row chunk.
The buffers (every layer's K and V) are reached through a table of their base addresses (:class:`.kv_move.KVRows`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
          torch.uint8: tl.uint8, torch.int8: tl.int8}


@triton.jit
def _move_rows_kernel(PTRS, SRC, DST, s_sb, s_db, W: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
                      DTYPE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    buf = tl.load(PTRS + tl.program_id(1)).to(tl.pointer_type(DTYPE))
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < ROW
    for c in range(0, W):
        s = tl.load(SRC + b * s_sb + c).to(tl.int64)
        d = tl.load(DST + b * s_db + c).to(tl.int64)
        live = (s >= 0) & (d >= 0) & (s != d)
        row = tl.load(buf + s * ROW + offs, mask=inside & live, other=0)
        tl.store(buf + d * ROW + offs, row, mask=inside & live)


def move_path_kv_triton(ptrs: torch.Tensor, dtype: torch.dtype, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``ptrs``: int64 [N] base addresses of N buffers of ``dtype`` whose rows are ``row`` contiguous elements."""
    batch, width = (int(x) for x in src.shape)
    if batch == 0 or width == 0 or ptrs.numel() == 0:
        return
    block = min(1024, triton.next_power_of_2(row))
    grid = (batch, int(ptrs.numel()), triton.cdiv(row, block))
    _move_rows_kernel[grid](ptrs, src, dst, src.stride(0), dst.stride(0), W=width, ROW=row, BLOCK=block,
                            DTYPE=_TYPES[dtype], num_warps=4)
