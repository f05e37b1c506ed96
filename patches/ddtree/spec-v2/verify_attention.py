"""The target's attention in a tree verify through DDTree's own kernel (the runtime's ``tree_verify_attention``).

SGLang's triton backend computes a DFLASH verify's attention with its extend kernel; given a custom mask (a
tree), the same kernel costs 1.45-1.6x its mask-free (chain) form on the Qwen3-8B shape (H100, bench/results/
round-overhead-*.md), and it runs one program per query head, reading each KV head's context once per query head.
DDTree's kernel takes all query heads of a KV head in one tile and splits the context across programs at small
batches (patches/ddtree/runtime/tree_attn_triton.py; the float32 reference beside it).

Where: the target's triton backend keeps its extend kernel as an instance attribute, ``extend_attention_fwd``,
which every extend call goes through. :func:`install` wraps that attribute on the target's backend (the drafter's
own backend is another instance, left alone) at worker start, before any CUDA-graph capture. The wrapper sends a
call to DDTree's kernel only when it is a tree verify the kernel computes exactly as SGLang's would: a custom mask
whose context part is skipped, page size 1, no sliding window, sinks, logit cap, score modifier, KV scales, or
split prefix / extend stages; anything else goes to SGLang's kernel unchanged. In a DDTree server the target's
only custom-mask extends are tree verifies (the chain's verify and every prefill pass no mask).

``DDTREE_VERIFY_ATTN``: ``sglang`` (default until proven on a GPU with the real server) keeps SGLang's kernel;
``ddtree`` installs DDTree's. Anything else is refused, naming the variable.
"""
from __future__ import annotations

import inspect
import logging
import math
import os
from typing import Any, Callable

logger = logging.getLogger(__name__)

VERIFY_ATTN_ENV = "DDTREE_VERIFY_ATTN"
CHOICES = ("sglang", "ddtree")
DEFAULT = "sglang"


def choice() -> str:
    """``DDTREE_VERIFY_ATTN`` (the default unless set); anything else is refused, naming the variable."""
    value = os.environ.get(VERIFY_ATTN_ENV, DEFAULT).strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ValueError(f"{VERIFY_ATTN_ENV}={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def _exact_for_tree_kernel(a: dict) -> bool:
    """Whether SGLang's kernel would compute, for these arguments, exactly the attention DDTree's kernel does."""
    window = a.get("sliding_window_size")
    return (a.get("custom_mask") is not None and a.get("mask_indptr") is not None
            and a.get("skip_prefix_custom_mask", True)
            and (window is None or int(window) <= 0)
            and a.get("sinks") is None and not a.get("logit_cap")
            and (a.get("xai_temperature_len") is None or int(a.get("xai_temperature_len")) <= 0)
            and a.get("lse_extend") is None and not a.get("skip_prefix") and not a.get("skip_extend")
            and int(a.get("page_size") or 1) == 1 and a.get("score_mod") is None
            and float(a.get("k_scale", 1.0)) == 1.0 and float(a.get("v_scale", 1.0)) == 1.0
            and a.get("window_kv_offsets") is None)


def wrap(original: Callable, tree_attention: Callable) -> Callable:
    """``original`` (SGLang's ``extend_attention_fwd``) with tree verifies sent to ``tree_attention``."""
    sig = inspect.signature(original)

    def extend_attention_fwd(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if not _exact_for_tree_kernel(a):
            return original(*args, **kwargs)
        q = a["q_extend"]
        scale = a.get("sm_scale") or 1.0 / math.sqrt(int(q.shape[-1]))
        tree_attention(q, a["k_extend"], a["v_extend"], a["o_extend"], a["k_buffer"], a["v_buffer"],
                       a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["custom_mask"], a["mask_indptr"],
                       float(scale), int(a["max_len_extend"]))
        return None

    extend_attention_fwd.ddtree_tree_attention = True  # type: ignore[attr-defined]
    extend_attention_fwd.__wrapped__ = original  # type: ignore[attr-defined]
    return extend_attention_fwd


def install(backend: Any, tree_attention: Callable, *, which: str | None = None) -> bool:
    """Wrap ``backend.extend_attention_fwd`` (a triton backend) when ``DDTREE_VERIFY_ATTN`` (or ``which``) says
    ``ddtree``; True when installed (or already there)."""
    which = which or choice()
    if which != "ddtree":
        return False
    current = getattr(backend, "extend_attention_fwd", None)
    if current is None:
        raise RuntimeError(f"DDTree: {type(backend).__name__} has no extend_attention_fwd to route tree verifies "
                           f"through ({VERIFY_ATTN_ENV}=ddtree)")
    if getattr(current, "ddtree_tree_attention", False):
        return True
    backend.extend_attention_fwd = wrap(current, tree_attention)
    logger.info("DDTree: tree verifies of %s use DDTree's tree-verify attention kernel (%s=ddtree).",
                type(backend).__name__, VERIFY_ATTN_ENV)
    return True
