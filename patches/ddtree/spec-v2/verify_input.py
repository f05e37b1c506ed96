"""The tree-shaped verify input: what the target's attention backend and graph runner see of a DDTree round.

It stays a ``DFlashVerifyInput`` (same spec-input type), so every DFLASH code path (graph runners, backends,
scheduler checks) treats it as a DFLASH verify of width N1 = budget + 1. ``draft_token`` / ``positions`` hold the
tree's nodes per request (node 0 = the root, parents before children) at depth positions (committed length +
depth); ``custom_mask`` is the ancestor mask in the backends' flat per-request layout (see the runtime's
``mask_ref``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.speculative.dflash_info import DFlashVerifyInput


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """A DFLASH verify over a tree. ``tree`` is the runtime's DraftTree; ``retrieve_*`` are its first-child /
    next-sibling links (int64 [bs, N1]) for tree-aware consumers (grammar bitmask, recurrent-state kernels)."""

    tree: Any = None
    retrieve_next_token: torch.Tensor | None = None
    retrieve_next_sibling: torch.Tensor | None = None
