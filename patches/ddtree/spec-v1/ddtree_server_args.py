"""DDTree's server arguments on SGLang 0.5.11: `--speculative-ddtree-budget`'s checks and the widths it sets.

DDTree keeps DFLASH's whole code path (worker, draft runner, checks) and only changes the verify step:
`speculative_num_draft_tokens` becomes the verify width (budget + 1: the root plus the tree nodes), and the draft
block size moves to `speculative_dflash_block_size`. `ServerArgs._handle_speculative_decoding` (patch 0001) calls
`pre_resolve` before DFLASH resolves the block size and `post_resolve` after, only when the flag is given. Vendored
whole by the 0.5.11 patch set (patches/ddtree/spec-v1/); it imports nothing from SGLang.
"""

from __future__ import annotations

import logging
from typing import Optional

logger = logging.getLogger(__name__)

# DDTree limits: the verify width (budget + 1) bounds the tree mask and the CUDA-graph
# buffers; 1024 matches the largest tree SGLang's tree kernels accept.
DDTREE_MAX_VERIFY_WIDTH = 1024
DDTREE_MAX_DEPTH = 31  # the runtime's tree-depth limit (draft block size - 1)


def pre_resolve(args) -> Optional[int]:
    """Validate --speculative-ddtree-budget before DFLASH resolves the block size.

    `args` is the ServerArgs. Refuses the flag under any algorithm but DFLASH. Returns the budget, or None when
    DDTree is off.
    """
    budget = args.speculative_ddtree_budget
    if budget is None:
        return None
    if args.speculative_algorithm != "DFLASH":
        raise ValueError(
            "--speculative-ddtree-budget requires --speculative-algorithm DFLASH "
            "(DDTree builds its draft tree from the DFlash drafter), "
            f"got speculative_algorithm={args.speculative_algorithm!r}."
        )
    if isinstance(budget, bool) or int(budget) != budget or int(budget) < 1:
        raise ValueError(
            f"--speculative-ddtree-budget must be a positive integer, got {budget!r}."
        )
    budget = int(budget)
    if budget + 1 > DDTREE_MAX_VERIFY_WIDTH:
        raise ValueError(
            f"--speculative-ddtree-budget={budget} is too large: the verify width "
            f"(budget + 1) must be <= {DDTREE_MAX_VERIFY_WIDTH}."
        )
    args.speculative_ddtree_budget = budget
    if args.speculative_num_draft_tokens is not None:
        already_resolved = (
            args.speculative_dflash_block_size is not None
            and int(args.speculative_num_draft_tokens) == budget + 1
        )
        if not already_resolved:
            raise ValueError(
                "With --speculative-ddtree-budget the verify width is budget + 1 and is set "
                "automatically; do not pass --speculative-num-draft-tokens. Set the draft "
                "block size with --speculative-dflash-block-size (or let the draft config "
                f"decide). Got speculative_num_draft_tokens={args.speculative_num_draft_tokens}, "
                f"speculative_ddtree_budget={budget}."
            )
        # Re-resolution of already resolved args: let DFLASH see the block size again.
        args.speculative_num_draft_tokens = None
    return budget


def post_resolve(args, budget: int) -> None:
    """After DFLASH resolved the block size: check what DDTree supports, set widths."""
    block_size = int(args.speculative_num_draft_tokens)
    if block_size < 2:
        raise ValueError(
            "DDTree needs a DFlash draft block size >= 2 (at least one draft depth), "
            f"got block_size={block_size}."
        )
    unsupported = []
    if block_size - 1 > DDTREE_MAX_DEPTH:
        unsupported.append(
            f"a draft block size of {block_size} (the DDTree runtime builds trees up to depth "
            f"{DDTREE_MAX_DEPTH}, i.e. block size <= {DDTREE_MAX_DEPTH + 1})"
        )
    if int(args.page_size or 1) != 1:
        unsupported.append(
            f"--page-size {args.page_size} (DDTree keeps accepted tree nodes by remapping "
            "req_to_token slot by slot, which needs --page-size 1)"
        )
    backends = {
        "attention_backend": args.attention_backend,
        "decode_attention_backend": args.decode_attention_backend,
        "prefill_attention_backend": args.prefill_attention_backend,
    }
    bad = {k: v for k, v in backends.items() if v not in (None, "triton")}
    if args.attention_backend != "triton" or bad:
        unsupported.append(
            "attention backend other than triton "
            f"({', '.join(f'{k}={v!r}' for k, v in backends.items() if v is not None) or 'none chosen'}); "
            "the tree verify needs a custom attention mask, use --attention-backend triton"
        )
    if args.speculative_dflash_draft_window_size is not None:
        unsupported.append("--speculative-dflash-draft-window-size")
    if args.enable_two_batch_overlap:
        unsupported.append("--enable-two-batch-overlap")
    if unsupported:
        raise ValueError(
            "DDTree (--speculative-ddtree-budget) does not support yet: "
            + "; ".join(unsupported)
            + "."
        )
    args.speculative_dflash_block_size = block_size
    args.speculative_num_draft_tokens = budget + 1
    logger.info(
        "DDTree enabled: budget=%d, verify width=%d, draft block size=%d.",
        budget,
        budget + 1,
        block_size,
    )
