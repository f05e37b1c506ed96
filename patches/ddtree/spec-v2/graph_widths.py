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

What the widest width keeps reserved, whatever budget the rounds run (the chain for hours included), and why only a
restart gives it back: everything it sizes is sized once, at start-up. (1) The target's decode graph runner sizes
its static buffers (input ids, positions, KV slot locations: largest captured batch x widest verify) and the verify
mask buffer before any size is selected, i.e. at the widest verify, and every captured graph reads them in place;
the graphs themselves live in one private memory pool, which torch frees only when every graph in it is destroyed,
and SGLang has no way to capture its decode graphs again while it serves. (2) The draft graph's tail holds one tree
builder per budget of the schedule, each with fixed buffers for the largest captured batch, read in place by the
draft graph. (3) The KV pool was sized at start-up (its token count, ``max_total_num_tokens``, from the static
memory fraction; SGLang does not resize it while serving) and its per-request rows (``req_to_token``) are the context
length plus the widest verify wide (``kv_cache_configurator``). (4) Each running request's lookahead
(``config.kv_reservation``: committed + block + widest verify slots, out of that pool) is not a start-up size but is
not given back either: the scheduler allocates it in ``prepare_for_decode``, before the worker's round picks its
width, and an allocation never shrinks below what a request already holds (``max(allocated, ...)``), so those slots
return to the pool when the request finishes. A lookahead sized by the next round's width (which the hysteresis
makes known at that point) would only make later allocations smaller; it is not built. The hysteresis
(``runtime schedule.Hysteresis``) changes none of (1)-(4): it only delays a change between the widths captured here.
"""
from __future__ import annotations

import bisect
from typing import Any, Optional, Sequence

from .config import enabled, max_verify_width, schedule_of, verify_width


class RunnerWidths:
    """Per-batch-size verify widths of one target graph runner (see the module docstring).

    A size's *kind* is "tree" (width budget + 1, captured with the tree mask) or "chain" (the block, the chain's
    causal verify). Its primary kind follows its budget; with adaptation on, tree sizes are captured as "chain" too
    (a second graph keyed by :meth:`graph_label`), so the round can drop them to the chain."""

    def __init__(self, schedule: Any, block_size: int, *, adapt: bool = False):
        self.schedule = schedule
        self.block = int(block_size)
        self.adapt = bool(adapt)
        self.max_width = max_verify_width(schedule, self.block, with_chain=self.adapt)
        self.bs: Optional[int] = None
        self.kind: Optional[str] = None

    def budget(self, bs: int) -> int:
        return int(self.schedule.budget_for(int(bs)))

    def width(self, bs: int) -> int:
        return verify_width(self.budget(bs), self.block)

    def primary(self, bs: int) -> str:
        return "tree" if self.budget(bs) > 0 else "chain"

    def kinds(self, bs: int) -> tuple[str, ...]:
        """The graphs captured at size ``bs``: its primary kind, plus the chain's under adaptation."""
        first = self.primary(bs)
        return (first, "chain") if self.adapt and first == "tree" else (first,)

    def select(self, bs: Optional[int], kind: Optional[str] = None) -> None:
        """The size (captured, or padded to a captured one) and kind the runner works on next; None = none. A
        kind not captured at that size falls back to the primary (its width then mismatches: eager)."""
        self.bs = None if bs is None else int(bs)
        if self.bs is None:
            self.kind = None
        else:
            self.kind = kind if kind in self.kinds(self.bs) else self.primary(self.bs)

    def current(self) -> int:
        if self.bs is None:
            return self.max_width
        return self.width(self.bs) if self.kind == "tree" else self.block

    def tree_now(self) -> bool:
        """Whether the selected graph verifies a tree (it is captured with the tree-mask buffer)."""
        if self.bs is None:
            return self.schedule.max_budget > 0
        return self.kind == "tree"

    def graph_label(self, variant_label: Optional[str]) -> Optional[str]:
        """The graph key's variant: the base's label, tagged when the selected kind is not the size's primary."""
        if self.bs is None or self.kind == self.primary(self.bs):
            return variant_label
        return f"{variant_label}+ddtree-{self.kind}" if variant_label else f"ddtree-{self.kind}"


def runner_widths(model_runner: Any, spec: Any) -> Optional[RunnerWidths]:
    """The widths for a decode graph runner: None for the draft runner (always the drafter's block), with DDTree
    off, or with a single budget and no adaptation (one width: the base's own behaviour)."""
    if getattr(model_runner, "is_draft_worker", False) or not enabled(spec):
        return None
    schedule = schedule_of(spec)
    block = getattr(spec, "speculative_dflash_block_size", None)
    adapt = bool(getattr(spec, "speculative_ddtree_adapt", False))
    if schedule is None or block is None or (schedule.is_single and not adapt):
        return None
    return RunnerWidths(schedule, int(block), adapt=adapt)


def pad_to_captured(bs: int, capture_bs: Optional[Sequence[int]]) -> int:
    """The captured batch size a batch of ``bs`` replays at (the smallest captured size >= bs), or ``bs`` itself
    when nothing is captured or the batch is larger than every captured size (it runs eagerly)."""
    if not capture_bs:
        return int(bs)
    sizes = sorted(int(s) for s in capture_bs)
    i = bisect.bisect_left(sizes, int(bs))
    return sizes[i] if i < len(sizes) else int(bs)


def verify_kind(spec_info: Any) -> str:
    """"tree" for DDTree's verify input, "chain" for anything else (the stock chain's)."""
    return "tree" if type(spec_info).__name__ == "DDTreeVerifyInput" else "chain"


def select_for_batch(runner: Any, forward_batch: Any) -> None:
    """Patch 0003's entry-point hook: select the padded size of ``forward_batch`` and the kind of its verify."""
    widths = getattr(runner, "_ddtree_widths", None)
    if widths is not None:
        widths.select(pad_to_captured(forward_batch.batch_size, getattr(runner, "capture_bs", None)),
                      verify_kind(getattr(forward_batch, "spec_info", None)))
