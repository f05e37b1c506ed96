"""Result containers shared by every step of a DDTree round.

They are plain dataclasses of tensors (no methods that touch the data) so that a CUDA-graph runner can keep
them as static buffers and the SGLang patch set can pass them through its own structures unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class DraftTree:
    """A batch of draft trees, all ``[B, N1]`` (node 0 is the root) unless noted.

    Unused slots (when fewer than ``N1`` nodes exist, e.g. vocab < budget) hold token 0, parent -1, depth 0,
    score -inf, first_child -1, next_sibling -1; they sit after the ``num_nodes`` valid ones.
    """

    token: Tensor  # int64; token[:, 0] = root token
    parent: Tensor  # int32; -1 for the root and unused slots
    depth: Tensor  # int32; 0 for the root
    score: Tensor  # float32; 0 at the root, -inf for unused slots
    first_child: Tensor  # int32; -1 = none
    next_sibling: Tensor  # int32; -1 = none (siblings linked in ascending node index)
    num_nodes: Tensor  # int32 [B]; valid nodes including the root
    max_depth: int = 0  # static L (draft depths) the tree was built with; 0 = unknown (walks then allow N1 - 1)


@dataclass
class VerifyInputs:
    """Everything the target's tree-verify forward needs, for the whole batch."""

    positions: Tensor  # int64 [B, N1] = committed_lens[:, None] + depth
    mask: Tensor  # bool [B, N1, N1]; mask[b, i, j] = j is i or an ancestor of i
    packed_mask: Tensor  # int32 [B, N1, ceil(N1 / 32)]; bit (j % 32) of word j // 32
    retrive_index: Tensor  # int64 [B, N1] = b * N1 + i
    retrive_next_token: Tensor  # int64 [B, N1] = first_child
    retrive_next_sibling: Tensor  # int64 [B, N1] = next_sibling


@dataclass
class WalkResult:
    """Outcome of the acceptance walk for every request of the batch."""

    accepted_nodes: Tensor  # int32 [B, L+1]; [:, 0] = 0, then the accepted path; -1 padding
    accept_len: Tensor  # int32 [B]; accepted draft nodes excluding the root (0..L)
    accepted_tokens: Tensor  # int64 [B, L+1]; accepted draft tokens then the bonus; -1 padding
    bonus_token: Tensor  # int64 [B]; target token at the last accepted node
