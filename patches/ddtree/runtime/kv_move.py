"""Public entry: the accepted path's KV rows moved into place on a paged KV cache (reference in :mod:`.kv_move_ref`)."""
from __future__ import annotations

import torch

from ._dispatch import use_triton
from .kv_move_ref import move_path_kv_torch

__all__ = ["KVRows", "move_path_kv"]


class KVRows:
    """The buffers whose rows move together (every attention layer's K and V of a KV pool), checked once: one
    dtype, one row shape, rows contiguous (``[slots, ...]`` with ``stride(0)`` the row's size). The table of their
    base addresses the kernel reads is built here, once (the pool's buffers never move)."""

    def __init__(self, buffers: list[torch.Tensor]):
        if not buffers:
            raise ValueError("KVRows needs at least one buffer")
        first = buffers[0]
        row = first[0].numel() if first.shape[0] else 0
        for i, buf in enumerate(buffers):
            if buf.dtype != first.dtype or buf.shape[1:] != first.shape[1:] or buf.device != first.device:
                raise ValueError(f"KV buffer {i}: {tuple(buf.shape)} {buf.dtype} on {buf.device} differs from buffer 0's "
                                 f"{tuple(first.shape)} {first.dtype} on {first.device}")
            if not buf.is_contiguous() or buf.stride(0) != row:
                raise ValueError(f"KV buffer {i}: rows are not contiguous (shape {tuple(buf.shape)}, strides "
                                 f"{buf.stride()}): only a token-major (NHD) layout's rows can be moved")
        self.buffers = list(buffers)
        self.dtype = first.dtype
        self.row = int(row)
        self.ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=first.device)


def move_path_kv(rows: KVRows, src: torch.Tensor, dst: torch.Tensor, impl: str = "auto") -> None:
    """For every request ``b``, column by column in order: each buffer's row ``src[b, c]`` copied to ``dst[b, c]``
    (``kv_compaction``'s pairs: the accepted path's nodes to the slots of their positions); -1 or ``src == dst``
    skipped. No host sync on the triton path; one launch for every buffer."""
    if use_triton(impl, src, rows.buffers[0]):
        from .kv_move_triton import move_path_kv_triton

        return move_path_kv_triton(rows.ptrs, rows.dtype, rows.row, src.contiguous(), dst.contiguous())
    return move_path_kv_torch(rows.buffers, src, dst)
