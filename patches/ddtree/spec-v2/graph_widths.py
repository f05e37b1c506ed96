"""A verify width per captured batch size: what the target's decode CUDA-graph runner captures and replays under a
DDTree budget schedule (``--speculative-ddtree-budget 1:64,8:32,32:0``).

The base runner has one static width (``captured_req_width``) for every batch size. Patch 0003 makes that
attribute read :meth:`RunnerWidths.current`, which is the width of the batch size the runner is working on right
now: the size being captured, or the padded (captured) size of the batch being checked or replayed, selected at
the runner's entry points (capture loop, ``can_run_graph``, ``load_batch``). Before any size is selected (buffer
sizing at start-up, the warm-up forward) it is the widest verify, so every buffer is sized by it.

Width at a budget: ``budget + 1`` tree nodes, or the chain's block at budget 0, whose graph is captured exactly as
the stock chain's (no tree mask: the chain's causal verify). A single budget N makes no ``RunnerWidths`` at all:
the runner keeps its one width, byte for byte the proven single-budget path.
"""
from __future__ import annotations

import bisect
from typing import Any, Optional, Sequence

from .config import enabled, max_verify_width, schedule_of, verify_width


class RunnerWidths:
    """Per-batch-size verify widths of one target graph runner (see the module docstring)."""

    def __init__(self, schedule: Any, block_size: int):
        self.schedule = schedule
        self.block = int(block_size)
        self.max_width = max_verify_width(schedule, self.block)
        self.bs: Optional[int] = None

    def budget(self, bs: int) -> int:
        return int(self.schedule.budget_for(int(bs)))

    def width(self, bs: int) -> int:
        return verify_width(self.budget(bs), self.block)

    def select(self, bs: Optional[int]) -> None:
        """The batch size (captured, or padded to a captured one) the runner works on next; None = none."""
        self.bs = None if bs is None else int(bs)

    def current(self) -> int:
        return self.max_width if self.bs is None else self.width(self.bs)

    def tree_now(self) -> bool:
        """Whether the selected size verifies a tree (its graph is captured with the tree-mask buffer)."""
        return (self.schedule.max_budget if self.bs is None else self.budget(self.bs)) > 0


def runner_widths(model_runner: Any, spec: Any) -> Optional[RunnerWidths]:
    """The widths for a decode graph runner: None for the draft runner (always the drafter's block), with DDTree
    off, or with a single budget (one width: the base's own behaviour)."""
    if getattr(model_runner, "is_draft_worker", False) or not enabled(spec):
        return None
    schedule = schedule_of(spec)
    block = getattr(spec, "speculative_dflash_block_size", None)
    if schedule is None or schedule.is_single or block is None:
        return None
    return RunnerWidths(schedule, int(block))


def pad_to_captured(bs: int, capture_bs: Optional[Sequence[int]]) -> int:
    """The captured batch size a batch of ``bs`` replays at (the smallest captured size >= bs), or ``bs`` itself
    when nothing is captured or the batch is larger than every captured size (it runs eagerly)."""
    if not capture_bs:
        return int(bs)
    sizes = sorted(int(s) for s in capture_bs)
    i = bisect.bisect_left(sizes, int(bs))
    return sizes[i] if i < len(sizes) else int(bs)


def select_for_batch(runner: Any, bs: int) -> None:
    """Patch 0003's entry-point hook: select the padded size of a batch of ``bs`` on ``runner``'s widths."""
    widths = getattr(runner, "_ddtree_widths", None)
    if widths is not None:
        widths.select(pad_to_captured(bs, getattr(runner, "capture_bs", None)))
