"""Tree-verify inputs for the whole batch in one Triton launch (grid = B x row blocks).

Each program takes a block of rows (nodes), walks their parent chains ``max_depth`` times and writes, per
column tile, the bool mask row, and once the bit-packed row, plus positions and SGLang's retrieve arrays.
Parent chains are re-walked per column tile (a few L1-resident loads) instead of materialising an
ancestor list, which keeps every block 2-D and small.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2
from .types import DraftTree, VerifyInputs
from .verify_ref import walk_steps


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _verify_kernel(
    parent_ptr, depth_ptr, first_ptr, next_ptr, committed_ptr,
    pos_ptr, mask_ptr, packed_ptr, ridx_ptr, rnext_ptr, rsib_ptr,
    W, N1: tl.constexpr,
    STEPS: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr, WB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BI + tl.arange(0, BI)
    rmask = rows < N1
    base = b * N1
    start = tl.where(rmask, rows, -1)

    depth = tl.load(depth_ptr + base + rows, mask=rmask, other=0)
    committed = tl.load(committed_ptr + b)
    tl.store(pos_ptr + base + rows, committed + depth.to(tl.int64), mask=rmask)
    tl.store(ridx_ptr + base + rows, base + rows, mask=rmask)
    tl.store(rnext_ptr + base + rows, tl.load(first_ptr + base + rows, mask=rmask, other=-1).to(tl.int64),
             mask=rmask)
    tl.store(rsib_ptr + base + rows, tl.load(next_ptr + base + rows, mask=rmask, other=-1).to(tl.int64),
             mask=rmask)

    # bit-packed rows: bit (a % 32) of word a // 32 for every ancestor a (self included)
    words = tl.arange(0, WB)
    packed = tl.zeros([BI, WB], dtype=tl.int32)
    cur = start
    for _ in range(STEPS + 1):
        bit = tl.where(cur >= 0, tl.full([BI], 1, tl.int32) << (cur & 31), 0)
        packed = packed | tl.where((cur >> 5)[:, None] == words[None, :], bit[:, None], 0)
        cur = tl.where(cur >= 0, tl.load(parent_ptr + base + cur, mask=cur >= 0, other=-1), -1)
    row_off = (base + rows).to(tl.int64)[:, None]
    tl.store(packed_ptr + row_off * W + words[None, :], packed, mask=rmask[:, None] & (words[None, :] < W))

    # bool rows, one column tile at a time
    for j0 in range(0, N1, BJ):
        cols = j0 + tl.arange(0, BJ)
        hit = tl.zeros([BI, BJ], dtype=tl.int1)
        cur = start
        for _ in range(STEPS + 1):
            hit = hit | (cur[:, None] == cols[None, :])
            cur = tl.where(cur >= 0, tl.load(parent_ptr + base + cur, mask=cur >= 0, other=-1), -1)
        tl.store(mask_ptr + row_off * N1 + cols[None, :], hit, mask=rmask[:, None] & (cols[None, :] < N1))


def build_verify_inputs_triton(tree: DraftTree, committed_lens: torch.Tensor) -> VerifyInputs:
    batch, n1 = tree.parent.shape
    dev = tree.parent.device
    words = (n1 + 31) // 32
    out = VerifyInputs(
        positions=torch.empty((batch, n1), device=dev, dtype=torch.int64),
        mask=torch.empty((batch, n1, n1), device=dev, dtype=torch.bool),
        packed_mask=torch.empty((batch, n1, words), device=dev, dtype=torch.int32),
        retrive_index=torch.empty((batch, n1), device=dev, dtype=torch.int64),
        retrive_next_token=torch.empty((batch, n1), device=dev, dtype=torch.int64),
        retrive_next_sibling=torch.empty((batch, n1), device=dev, dtype=torch.int64),
    )
    bi = 16
    bj = min(next_pow2(n1), 128)
    _verify_kernel[(batch, triton.cdiv(n1, bi))](
        tree.parent.contiguous(), tree.depth.contiguous(), tree.first_child.contiguous(),
        tree.next_sibling.contiguous(), committed_lens.to(torch.int64).contiguous(),
        out.positions, out.mask, out.packed_mask, out.retrive_index, out.retrive_next_token,
        out.retrive_next_sibling,
        words, N1=n1,
        STEPS=walk_steps(tree), BI=bi, BJ=bj, WB=next_pow2(words, 1),
        num_warps=4,
    )
    return out
