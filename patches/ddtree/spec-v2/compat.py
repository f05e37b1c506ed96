"""Names that moved between the spec-v2 bases (0.5.14 and later), resolved once, newest location first, the one
worker call whose keywords changed, and how a resolved ServerArgs copy of our own is written.

Each entry is looked up lazily so that importing this package never pulls in GPU-only modules; a name found in
none of the places is a clear ImportError naming every place tried.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

_PLACES: dict[str, tuple[str, ...]] = {
    "assign_extend_cache_locs_func": ("sglang.kernels.ops.speculative.cache_locs",
                                      "sglang.srt.speculative.eagle_info_v2",
                                      "sglang.srt.speculative.spec_utils",
                                      "sglang.srt.speculative.triton_ops.cache_locs"),
    "GenerationBatchResult": ("sglang.srt.managers.utils", "sglang.srt.managers.scheduler"),
    "GrammarTree": ("sglang.srt.speculative.spec_utils",),
    "build_grammar_vocab_mask": ("sglang.srt.speculative.spec_utils",),
    "apply_dflash_verify_logits_adjustments": ("sglang.srt.speculative.dflash_utils",),
    "ForwardMode": ("sglang.srt.model_executor.forward_batch_info",),
    "CaptureHiddenMode": ("sglang.srt.model_executor.forward_batch_info",),
    # 0.5.19+: resolvers record their writes in the declaration stash (the fields are projected from it)
    "declare_resolution": ("sglang.srt.arg_groups.overrides",),
}
_CACHE: dict[str, Any] = {}


def base_name(name: str) -> Any:
    """The object ``name`` from the first module of its place list that has it."""
    if name in _CACHE:
        return _CACHE[name]
    tried = []
    for module in _PLACES[name]:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            tried.append(f"{module} (does not import)")
            continue
        if hasattr(mod, name):
            _CACHE[name] = getattr(mod, name)
            return _CACHE[name]
        tried.append(module)
    raise ImportError(f"DDTree: {name} is in none of {', '.join(tried)}: this SGLang is not a supported base")


def write_resolved(args: Any, source: str, **fields: Any) -> None:
    """Set ``fields`` on resolved server arguments that this package owns (the draft worker's private copy, on the
    bases that build one: 0.5.14-0.5.16). 0.5.16: ``ServerArgs.override(source, ...)``, the audited mutation
    point; 0.5.14 / 0.5.15: plain assignment."""
    override = getattr(args, "override", None)
    if override is not None:
        override(source, **fields)
        return
    for key, value in fields.items():
        setattr(args, key, value)


def resolution_write(args: Any, source: str, **fields: Any) -> None:
    """A write made while the server arguments resolve (DDTree's ``pre_resolve`` / ``post_resolve``).

    0.5.19 and later resolve through a declaration stash (``arg_groups.overrides.declare_resolution``): the fields
    are projected from it when resolution ends, so a plain assignment would be replaced by the base's own
    declarations (and 0.5.20 refuses it); the write is declared after them, and readers read the resolved view
    (``config.resolved``). Older bases: plain assignment."""
    try:
        declare = base_name("declare_resolution")
    except ImportError:
        declare = None
    if declare is not None:  # the record keeps the user's input (0.5.20 refuses a write to it during resolution)
        declare(args, source, **fields)
        return
    for key, value in fields.items():
        setattr(args, key, value)


_PARAMS: dict[Callable, frozenset] = {}


def _parameters(fn: Callable) -> frozenset:
    if fn not in _PARAMS:
        _PARAMS[fn] = frozenset(inspect.signature(fn).parameters)
    return _PARAMS[fn]


def next_draft_input_decode(worker: Any, *, draft_input: Any, bonus_tokens: Any, new_seq_lens: Any) -> Any:
    """The next round's draft input, made by the base worker's own constructor with that base's keywords.

    0.5.15 and later take ``bonus_tokens``. 0.5.14 takes ``verified_id`` and, as its chain does, carries the
    allocation watermark forward (``cur_allocated_seq_lens_cpu`` = this round's reservation) and a recorded
    ``verify_done`` event that the next ``prepare_for_decode`` waits on before it touches shared buffers.
    """
    make = worker._make_next_draft_input_decode
    params = _parameters(type(worker)._make_next_draft_input_decode)
    if "bonus_tokens" in params:
        return make(bonus_tokens=bonus_tokens, new_seq_lens=new_seq_lens)
    if "verified_id" not in params:
        raise TypeError("DDTree: this SGLang's _make_next_draft_input_decode takes neither bonus_tokens nor "
                        f"verified_id ({', '.join(sorted(params))}): not a supported base")
    kw = {}
    if "cur_allocated_seq_lens_cpu" in params:
        kw["cur_allocated_seq_lens_cpu"] = getattr(draft_input, "reserved_seq_lens_cpu", None)
    nxt = make(verified_id=bonus_tokens, new_seq_lens=new_seq_lens, **kw)
    if "verify_done" in params:
        import torch

        done = torch.get_device_module(bonus_tokens.device).Event()
        done.record()
        nxt.verify_done = done
    return nxt
