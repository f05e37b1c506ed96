"""A request's own DDTree budget on SGLang: ``{"ddtree": {"budget": N}}`` or ``{"ddtree": {"speculative": false}}``
in the request's ``custom_params`` (``/generate``: ``sampling_params.custom_params``; the OpenAI endpoints:
``"custom_params"`` in the extra body), which every spec-v2 base passes from the request to the scheduler's ``Req``.
The runtime's ``schedule.request_budget`` reads it (one definition for the patch set and the reference engine).

What a round does with it: the batch runs the width the schedule gives its size (one target forward verifies
every request's tree, as one CUDA graph captured per batch size at one width, so a request cannot have a width of
its own); each request that asked for less has its tree cut to its own best ``N`` nodes after the verify
(``prune_tree``), before the walk. The best-first order makes those nodes exactly the tree a round at budget ``N``
builds, and a tree node's verify sees only its ancestors, so the request commits what a DDTree at budget ``N``
would (greedy: token for token; sampled: the same law), and ``0`` / ``speculative: false`` keeps the root only:
one target token per round, as plain decoding. The verify's compute is the batch's, whatever a request asks for.

Rounds the schedule runs as the DFlash chain (budget 0 at that batch size) are SGLang's own chain code, which DDTree
does not change: a request's setting does not apply there (a single-budget server never runs the chain).

A malformed setting is refused when the request arrives (the hook after ``SamplingParams.verify``: SGLang answers
it as a bad request naming the field), and only on a server that runs DDTree; anywhere else the key is ignored.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

_on = False  # DDTree's flags resolved in this process (the launcher, where requests are verified)
_UNSET = object()


def mark_enabled() -> None:
    """Called where the DDTree flags resolve (``hooks.handle_dflash``): from then on requests are checked here."""
    global _on
    _on = True


def _schedule() -> Any:
    from sglang.srt.speculative.ddtree import schedule

    return schedule


def check_request(sampling_params: Any) -> None:
    """After ``SamplingParams.verify``: a malformed ``ddtree`` setting is a ValueError naming the field."""
    if _on:
        _schedule().request_budget(getattr(sampling_params, "custom_params", None),
                                   source="sampling_params.custom_params")


def request_cap(req: Any) -> Optional[int]:
    """The budget ``req`` asks for (None: the server's), read once per request. A setting that was never verified
    and does not parse (a path that skipped the check) is logged once and ignored."""
    cached = getattr(req, "_ddtree_cap", _UNSET)
    if cached is not _UNSET:
        return cached
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    try:
        cap = _schedule().request_budget(params, source="sampling_params.custom_params")
    except ValueError as exc:
        logger.warning("DDTree: ignoring request %s's setting: %s", getattr(req, "rid", "?"), exc)
        cap = None
    try:
        req._ddtree_cap = cap
    except AttributeError:  # a request object that takes no new attributes: read again next round
        pass
    return cap


def round_caps(reqs: Optional[Sequence[Any]], budget: int) -> Optional[list[int]]:
    """Per request of the batch, the budget its tree keeps this round (its own, at most the round's), or None when
    no request asks for less than ``budget`` (nothing to cut)."""
    if not reqs:
        return None
    caps = [request_cap(r) for r in reqs]
    if all(c is None or c >= budget for c in caps):
        return None
    return [int(budget) if c is None else min(int(c), int(budget)) for c in caps]


def caps_tensor(caps: Sequence[int], device: Any) -> torch.Tensor:
    """``caps`` on ``device`` without a host sync: from pinned memory, non-blocking, on a GPU."""
    host = torch.tensor(list(caps), dtype=torch.int32)
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
