"""The target attention backends DDTree knows, one row each: how it finds them, what it refuses, where the mask goes.

Pure data with no import of SGLang or torch, like ``bases.py`` (the tests load both by path). ``config`` refuses
from it what the server arguments name (``--attention-backend`` and the prefill / decode overrides), ``round``
what the worker actually built (the backend's class) and reads from it how to write the verify mask. A backend
not in the table is refused with "no tree-mask support for DDTree". The README's backend x page-size table is
checked against this one (tests/test_backends_table.py).

Adding or proving a backend is its row here plus what its row cannot say (see docs/design.md, "Making a change").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PROVEN = "proven"
WIRED_UNPROVEN = "wired-unproven"
REFUSED = "refused"
STATUSES = (PROVEN, WIRED_UNPROVEN, REFUSED)

#: The verify-mask layouts. Every layout is SGLang's flat DFLASH one (per request ``N1`` rows of ``prefix + N1``
#: columns, back to back); they differ in what the backend reads of it, and so in what DDTree must write.
TREE_BLOCK = "tree block"  # only each request's N1 x N1 tree block is read: DDTree writes that alone
FULL_ROWS = "full rows"  # whole rows are read: DDTree writes the context columns too, as visible


@dataclass(frozen=True)
class Backend:
    """One attention backend.

    ``cls``: its class name in ``sglang.srt.layers.attention`` (the one a hybrid wrapper keeps as
    ``full_attn_backend``), which is how the worker recognises it. ``status``: ``proven`` (run on a GPU here:
    allowed), ``wired-unproven`` (DDTree drives it but it was not run on a GPU: refused unless
    ``--speculative-ddtree-allow-unproven``), ``refused`` (not driven: refused always). ``mask``: the layout it reads
    (:data:`TREE_BLOCK`, :data:`FULL_ROWS`); ``reads_context_columns``: DDTree must write the context columns
    (the runtime's ``write_verify_mask(prefix_cols=True)``). ``reason``: what the refusal prints after the backend's
    name ("" for a proven one). ``page_sizes``: the ``--page-size`` values DDTree is proven with on a GPU here (at
    page size 1 the commit reorders the verify range's KV slots, no copy). ``paged_wired``: larger page sizes are
    wired but not proven on a GPU (the accepted path's KV rows are copied to the slots of their positions, which stay
    in their pages: the runtime's ``move_path_kv``), so they are refused unless ``--speculative-ddtree-allow-unproven``.
    ``graph_mask``: on bases whose backends
    have no ``verify_mask`` buffer (0.5.14-0.5.16), the attribute holding the flat mask buffer its target-verify
    CUDA graph reads, which DDTree then writes in place (else a fresh tensor, which the backend copies).
    ``base_trait``: a ``bases.py`` field that must be true on the running base for the backend to be driven there,
    and ``base_reason`` what the refusal says where it is false.
    """

    cls: str
    status: str
    mask: str
    reads_context_columns: bool
    reason: str = ""
    page_sizes: tuple[int, ...] = (1,)
    paged_wired: bool = False
    graph_mask: Optional[str] = None
    base_trait: Optional[str] = None
    base_reason: str = ""


#: ``--attention-backend`` value -> its row.
BACKENDS: dict[str, Backend] = {
    "triton": Backend(cls="TritonAttnBackend", status=PROVEN, mask=TREE_BLOCK, reads_context_columns=False,
                      graph_mask="cuda_graph_custom_mask", paged_wired=True),
    "flashinfer": Backend(
        cls="FlashInferAttnBackend", status=WIRED_UNPROVEN, mask=FULL_ROWS, reads_context_columns=True,
        paged_wired=True,  # the paged commit copies KV rows in the pool both backends read (runtime move_path_kv)
        reason="FlashInfer reads the tree through spec_info.custom_mask in plan(); not run on a GPU here (the "
               "offline bundle ships a FlashInfer stand-in)",
        base_trait="flashinfer",
        base_reason="its FlashInfer verify arguments come through a KV-index translator and plan that DDTree's "
                    "verify input is not checked against"),
    "fa3": Backend(
        cls="FlashAttentionBackend", status=REFUSED, mask=TREE_BLOCK, reads_context_columns=False,
        reason="FA3 verifies trees only through its topk > 1 cascade, which DDTree does not drive yet (and the "
               "offline H200 bundle has no FA3 kernel library to prove it with)"),
}


def with_status(status: str) -> tuple[str, ...]:
    """The ``--attention-backend`` values whose row has ``status``, in table order."""
    return tuple(name for name, b in BACKENDS.items() if b.status == status)


def name_of_class(cls: str) -> Optional[str]:
    """The ``--attention-backend`` value of a backend class name, None for a class not in the table."""
    return next((name for name, b in BACKENDS.items() if b.cls == cls), None)
