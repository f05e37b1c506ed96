"""Names that moved between the spec-v2 bases (0.5.14 - 0.5.17), resolved once, newest location first.

Each entry is looked up lazily so that importing this package never pulls in GPU-only modules; a name found in
none of the places is a clear ImportError naming every place tried.
"""
from __future__ import annotations

import importlib
from typing import Any

_PLACES: dict[str, tuple[str, ...]] = {
    "assign_extend_cache_locs_func": ("sglang.kernels.ops.speculative.cache_locs",
                                      "sglang.srt.speculative.eagle_info_v2",
                                      "sglang.srt.speculative.spec_utils"),
    "GenerationBatchResult": ("sglang.srt.managers.utils", "sglang.srt.managers.scheduler"),
    "GrammarTree": ("sglang.srt.speculative.spec_utils",),
    "build_grammar_vocab_mask": ("sglang.srt.speculative.spec_utils",),
    "apply_dflash_verify_logits_adjustments": ("sglang.srt.speculative.dflash_utils",),
    "ForwardMode": ("sglang.srt.model_executor.forward_batch_info",),
    "CaptureHiddenMode": ("sglang.srt.model_executor.forward_batch_info",),
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
