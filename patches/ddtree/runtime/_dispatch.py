"""Choosing between the Triton kernels and the plain-torch references.

Triton is imported lazily and optionally: the runtime must import (and run, via the references) on hosts
without triton or without a GPU, e.g. the CPU reference engine in the deployment sandbox.
"""
from __future__ import annotations

import functools
import os

import torch

_IMPLS = ("auto", "triton", "torch")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when triton imports (checked once)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # pragma: no cover - depends on the host
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(impl: str, *tensors: torch.Tensor) -> bool:
    """Resolve ``impl`` for these inputs.

    "auto" takes triton only for CUDA tensors when triton imports; "triton" forces it (also on CPU tensors
    under ``TRITON_INTERPRET=1``, which is how the CPU tests run the kernels); "torch" forces the reference.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "torch":
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    if impl == "auto":
        return on_cuda and triton_available()
    if not triton_available():
        raise RuntimeError("impl='triton' requested but triton does not import")
    if not on_cuda and not _interpreting():
        raise RuntimeError("impl='triton' on CPU tensors needs TRITON_INTERPRET=1")
    return True


def next_pow2(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum); Triton blocks must be powers of two."""
    p = max(int(minimum), 1)
    while p < n:
        p *= 2
    return p
