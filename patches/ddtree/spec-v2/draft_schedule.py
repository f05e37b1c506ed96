"""The draft graph's tail under a DDTree budget schedule: each captured batch size folds in the head its budget
needs.

The base folds the chain's greedy head (``_DflashDraftSampler``) into the draft CUDA graph as a capture tail hook;
DDTree folds its per-depth top-k and tree build there instead (:class:`.draft_topk.DraftTreeBuilder`). With a
schedule, the graph captured at batch size B gets the tree builder of ``budget(B)`` (one builder per distinct
budget, each with its own fixed buffers), or, at budget 0, the base's own greedy head, so a chain round reads
``.out`` exactly as the stock worker does and is token-identical to it. With adaptation on, tree sizes run the
greedy head as well (a round there may drop to the chain). The draft graph's width stays the drafter's block at
every size; only its tail differs.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .draft_topk import DraftTreeBuilder, DraftTreeOut, HeadShard


class ScheduledDraftHead:
    """Capture tail hook + replay reader for a schedule (see the module docstring)."""

    def __init__(self, *, schedule: Any, block_size: int, trees: dict[int, DraftTreeBuilder],
                 chain: Optional[Any], also_chain: bool = False):
        self.schedule = schedule
        self.block_size = int(block_size)
        self.trees = dict(trees)
        self.chain = chain
        self.also_chain = bool(also_chain)  # adaptation: tree sizes may run the chain's round too
        missing = [b for b in schedule.budgets if b > 0 and b not in self.trees]
        if missing or ((0 in schedule.budgets or self.also_chain) and chain is None):
            raise ValueError(f"DDTree draft head for {schedule}: no builder for budget(s) "
                             f"{missing or [0]}")

    @property
    def out(self) -> torch.Tensor:
        """The chain's proposed tokens (what the stock worker reads after a replay at a budget-0 size)."""
        if self.chain is None:
            raise RuntimeError(f"DDTree schedule {self.schedule} has no chain sizes: no greedy head was folded in")
        return self.chain.out

    def __call__(self, hidden_states: torch.Tensor, input_ids: Optional[torch.Tensor] = None) -> None:
        """Tail hook body at capture: the builder of this captured size's budget (or the chain's head)."""
        bs = int(hidden_states.shape[0]) // self.block_size
        budget = int(self.schedule.budget_for(bs))
        if budget == 0 or self.also_chain:
            self.chain(hidden_states, input_ids)
        if budget > 0:
            self.trees[budget](hidden_states, input_ids)

    def read(self, budget: int, bs: int, root_tokens: Optional[torch.Tensor] = None) -> DraftTreeOut:
        """The tree the last replay built (``budget`` = the budget of the padded size it replayed at)."""
        return self.trees[int(budget)].read(bs, root_tokens)


def chain_head(head_cls: Callable[..., Any], *, lm_head: Any, block_size: int, max_bs: int,
               tp_group: Any) -> Any:
    """The base's greedy head (``head_cls`` = ``_DflashDraftSampler``) built as the base builds it; a clear error
    where the base would keep the chain's head eager (added vocab, TP without shard metadata), since a schedule's
    chain sizes read it from the graph."""
    shard = HeadShard.of(lm_head)
    world = int(getattr(tp_group, "world_size", 1) or 1)
    if shard.num_added:
        raise ValueError("DDTree: a schedule with chain sizes (budget 0) needs the base's folded greedy head, "
                         "which does not support added vocab; give budgets > 0 only")
    if world > 1 and getattr(lm_head, "shard_indices", None) is None:
        raise ValueError("DDTree: a schedule with chain sizes (budget 0) needs the LM head's shard metadata under "
                         "tensor parallelism; give budgets > 0 only")
    return head_cls(weight=lm_head.weight, block_size=int(block_size), num_org=shard.num_org,
                    org_vocab_start=shard.org_start, max_bs=int(max_bs),
                    tp_group=tp_group if world > 1 else None)
