"""The hooks DDTree puts into SGLang through its plugin framework (:mod:`.plugin` registers them).

Each series' ``patchset.yaml`` lists which of these its base gets (``hooks:``: target, type, this module's function,
and the sha256 of the target's definition in that base); each does what a hunk of the text series did, at a function
boundary, and nothing with DDTree off (every one of them looks at the DDTree flags, or at the backend's ``ddtree``
attribute, which is None with DDTree off).

Signatures follow SGLang's ``HookRegistry``: ``before`` gets the call's arguments, ``after`` the result then the
arguments, ``around`` the original function then the arguments.
"""
from __future__ import annotations

import sys
from typing import Any

_FLAGS = ("speculative_ddtree_adapt", "speculative_ddtree_allow_unproven", "speculative_ddtree_schedule")
#: DDTree's flags whose 0 is a value given (set when not None).
_VALUE_FLAGS = ("speculative_ddtree_budget", "speculative_ddtree_schedule_hold")


def _ddtree_flags(server_args: Any) -> bool:
    return any(getattr(server_args, flag, None) is not None for flag in _VALUE_FLAGS) or any(
        getattr(server_args, flag, None) for flag in _FLAGS)


# -- server arguments (arg_groups/speculative_hook.py, spec_info.py) -----------------------------------------------
def check_algorithm(self: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    """before ``SpeculativeAlgorithm.handle_server_args``: the budget needs DFLASH, DDTree's other flags need the
    budget (refused before the algorithm's own resolution runs)."""
    if _ddtree_flags(server_args):
        from .config import check_algorithm as check

        check(server_args)


def check_algorithm_after(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    """after ``handle_speculative_decoding``: the same check where no in-tree algorithm ran (none given, or one
    registered out of tree); where one ran it already passed and passes again (the check only reads)."""
    if _ddtree_flags(server_args):
        from .config import check_algorithm as check

        check(server_args)


def handle_dflash(original: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """around ``_handle_dflash``: the budget validated before DFLASH resolves its block size, the widths and the
    schedule set after (what DFLASH's resolution does after that point, the running-request default and mixed
    chunking, reads none of them)."""
    from . import config
    from .bases import BASES
    from .plugin import require_applied

    budget = config.pre_resolve(server_args)
    if budget is not None:
        require_applied("server-argument resolution")
        from .request_budget import mark_enabled

        mark_enabled()  # requests carrying their own budget are checked in this process (check_request_budget)
    result = original(server_args, *args, **kwargs)
    if budget is not None:
        row = BASES.get(config.base_version())
        config.post_resolve(server_args, budget, grammar_in_worker=row.grammar if row is not None else True)
    return result


def draft_verify_width(original: Any, self: Any, num_draft_tokens: int, is_draft_worker: bool, *args: Any,
                       **kwargs: Any) -> int:
    """around ``SpeculativeAlgorithm.get_num_tokens_per_req_for_target_verify``: the DFLASH draft runner works at
    the drafter's block size while the target verifies budget + 1 nodes."""
    if self.is_dflash() and is_draft_worker:
        from sglang.srt.runtime_context import get_spec

        from .config import draft_width

        width = draft_width(get_spec())
        if width is not None:
            return width
    return original(self, num_draft_tokens, is_draft_worker, *args, **kwargs)


# -- hybrid GatedDeltaNet targets (layers/attention/linear/gdn_backend.py) -----------------------------------------
def gdn_attach(result: Any, self: Any, model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """after ``GDNAttnBackend.__init__``: the tree verify of this backend's layers (``hybrid.TreeVerify``), or None
    with DDTree off."""
    from .hybrid import TreeVerify

    self.ddtree = TreeVerify.attach(self, model_runner)


def gdn_fill(result: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
    """after ``GDNAttnBackend.init_forward_metadata`` / ``init_forward_metadata_out_graph``: the tree's parents
    into the backend's fixed buffer (the captured verify graph reads them in place)."""
    tree = getattr(self, "ddtree", None)
    if tree is not None:
        tree.fill(forward_batch)


def gdn_forward_extend(original: Any, self: Any, layer: Any, forward_batch: Any, mixed_qkv: Any, a: Any, b: Any,
                       **kwargs: Any) -> Any:
    """around ``GDNAttnBackend.forward_extend``: TARGET_VERIFY over a tree through the runtime's tree kernels."""
    tree = getattr(self, "ddtree", None)
    if tree is not None and forward_batch.forward_mode.is_target_verify():
        import torch

        assert isinstance(mixed_qkv, torch.Tensor)
        # the base's own early return for an empty batch on ROCm (0.5.18+) comes first, as in its body
        hip = getattr(sys.modules.get(getattr(original, "__module__", "")), "_is_hip", False)
        if not (hip and mixed_qkv.shape[0] == 0):
            return tree.forward(self, layer, forward_batch, mixed_qkv, a, b)
    return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)


# -- metrics and per-request budgets (metrics.py, request_budget.py) -----------------------------------------------
def resolved_tokens(tokens: Any, self: Any, result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """after ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens``: SGLang has waited for the round and holds its
    accept lengths on the host; each request's round entry and the server-wide counters from them
    (``metrics.on_resolved``). Nothing without a DDTree worker."""
    from .metrics import on_resolved

    on_resolved(self, result, batch, tokens)


def request_meta_info(result: Any, self: Any, meta_info: Any, *args: Any, **kwargs: Any) -> None:
    """after ``TokenizerManager._calculate_spec_decoding_metrics`` (a finished request): its DDTree summary in
    ``meta_info`` beside SGLang's spec_* fields (``metrics.finish_meta_info``); nothing where no round entry came."""
    if isinstance(meta_info, dict) and "ddtree_round" in meta_info:
        from .metrics import finish_meta_info

        finish_meta_info(self, meta_info)


def check_request_budget(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """after ``SamplingParams.verify``: a malformed ``custom_params.ddtree`` is refused as a bad request, on a server
    that runs DDTree (``request_budget.check_request``)."""
    from .request_budget import check_request

    check_request(self)
