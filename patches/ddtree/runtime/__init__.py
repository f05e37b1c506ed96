"""DDTree runtime: GPU tree build, verify inputs, acceptance walk and KV compaction for a whole batch.

Every step has a Triton kernel (``*_triton.py``) and a plain-torch reference (``*_ref.py``); the public
functions pick one with ``impl`` ("auto" = triton on CUDA tensors when triton imports). No step synchronises
with the host on the triton path, so a full round can be captured in a CUDA graph.
Relocatable: relative imports only; vendored into SGLang as ``sglang/srt/speculative/ddtree/``.
Contract: docs/runtime-api.md.
"""
from __future__ import annotations

from .compaction import kv_compaction
from .selftest import self_test
from .topk import draft_topk
from .tree import build_tree
from .types import DraftTree, VerifyInputs, WalkResult
from .verify import build_verify_inputs
from .walk import accept_walk, sample_target_tokens

__version__ = "0.1.0"

__all__ = [
    "DraftTree",
    "VerifyInputs",
    "WalkResult",
    "__version__",
    "accept_walk",
    "build_tree",
    "build_verify_inputs",
    "draft_topk",
    "kv_compaction",
    "sample_target_tokens",
    "self_test",
]
