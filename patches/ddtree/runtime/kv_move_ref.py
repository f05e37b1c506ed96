"""Moving the accepted path's KV rows into place, in plain torch: the reference for :mod:`.kv_move_triton`.

With a paged KV cache (page size > 1) a request's positions must stay in their pages, so a tree round cannot commit
its accepted path by reordering ``req_to_token`` (what page size 1 does: :func:`.commit.path_first_slot_order`); the
path's KV rows are copied instead: the node at depth ``c`` of the path from its verify slot to the slot of position
``prefix + c`` (``kv_compaction``'s ``(src, dst)`` pairs, in path order). Each column ``c`` is done after the ones
before it: the node at depth ``c`` has index ``>= c`` (parents come before children), so slot ``c`` is read only by
columns before ``c`` and written by column ``c``; done in order, no copy reads a row a copy before it overwrote.
"""
from __future__ import annotations

import torch


def move_path_kv_torch(buffers: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """For every request ``b`` and column ``c`` in order: each buffer's row ``src[b, c]`` -> row ``dst[b, c]``;
    a -1 on either side, or ``src == dst``, is skipped. ``src`` / ``dst`` int [B, W]."""
    for c in range(int(src.shape[1])):
        s, d = src[:, c].to(torch.int64), dst[:, c].to(torch.int64)
        keep = (s >= 0) & (d >= 0) & (s != d)
        if not bool(keep.any()):
            continue
        s, d = s[keep], d[keep]
        for buf in buffers:
            buf[d] = buf[s]
