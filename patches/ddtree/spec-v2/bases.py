"""The spec-v2 bases, one row each: what the code and the tests need to know about a base's series.

Pure data with no import of SGLang or torch, so the tests (tests/sglang_v2/v2_helpers.py loads this file by path),
``config`` and ``hybrid`` read the same table. Adding a base is its folder ``patches/ddtree/sglang-<version>/`` (made
with ``ddtree-deploy patchset port``) plus one row here; a base that pins other CPU test dependencies also gets a
``tests/sglang_v2/requirements-cpu-<version>.txt`` (the Makefile installs each into its own folder).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Base:
    """Where the bases' series differ (each series' README says why).

    ``draft_width``: how the draft runner gets the drafter's block size while the target verifies budget + 1:
    "hook" = the target-verify width hook in spec_info.py (0.5.17+), "copy" = the draft worker's own copy of the
    server arguments (``config.draft_server_args``; 0.5.14-0.5.16, whose draft attention backend reads the width
    from that copy). ``tree_in_graph``: the tree build is folded into the draft CUDA graph (a capture hook exists).
    ``grammar``: the base's DFLASH worker does constrained decoding (so DDTree refuses a grammar backend as
    unproven); older bases abort grammar requests in the scheduler. ``schedule``: the series gives each captured
    batch size its own verify width (a budget schedule, ``--speculative-ddtree-adapt``). ``hybrid``: the series has
    patch 0004 (GatedDeltaNet hybrids through the runtime's tree kernels). ``flashinfer``: DDTree's verify input
    builds the base's FlashInfer verify arguments (checked on CPU against the base's own code); where not
    (0.5.22+: those arguments come through a KV-index translator and plan that DDTree's input is not checked
    against), ``--attention-backend flashinfer`` is refused with DDTree. ``meta_info``: a request's DDTree summary
    reaches its ``meta_info`` (its round entries ride SGLang's per-token ``customized_info``, which the output
    streamer aligns per request from 0.5.15; 0.5.14's appends only the requests that have the key, so one batch
    output mixing requests with and without it would misplace them: there only the server-wide ``/metrics``).
    """

    draft_width: str
    tree_in_graph: bool
    grammar: bool
    schedule: bool
    hybrid: bool
    flashinfer: bool = True
    meta_info: bool = True


BASES: dict[str, Base] = {
    "0.5.14": Base(draft_width="copy", tree_in_graph=False, grammar=False, schedule=False, hybrid=False,
                   meta_info=False),
    "0.5.15": Base(draft_width="copy", tree_in_graph=True, grammar=False, schedule=False, hybrid=False),
    "0.5.16": Base(draft_width="copy", tree_in_graph=True, grammar=False, schedule=False, hybrid=False),
    "0.5.17": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True),
    "0.5.18": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True),
    "0.5.19": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True),
    "0.5.20": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True),
    "0.5.21": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True),
    "0.5.22": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True,
                   flashinfer=False),
    "0.5.23": Base(draft_width="hook", tree_in_graph=True, grammar=True, schedule=True, hybrid=True,
                   flashinfer=False),
}


def with_trait(name: str) -> tuple[str, ...]:
    """The bases whose row has ``name`` true, oldest first."""
    return tuple(v for v, b in BASES.items() if getattr(b, name))
