"""How much per-node recurrent state a DDTree budget costs, and the start-up check that names the largest
budget that fits (see :mod:`.tree_recurrent` for what is kept per node and why).
"""
from __future__ import annotations

import torch

from .tree_recurrent_ref import MAX_TREE_NODES


def _nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def per_node_state_bytes(H: int, K: int, V: int, conv_dim: int, K_conv: int,  # noqa: N803
                         dtype: torch.dtype = torch.float32, conv_dtype: torch.dtype | None = None) -> int:
    """Bytes one tree node costs in one recurrent layer: its SSM state (H value heads x V x K) and conv window."""
    conv_dtype = conv_dtype or dtype
    return H * V * K * _nbytes(dtype) + conv_dim * (K_conv - 1) * _nbytes(conv_dtype)


def max_budget_for_bytes(bytes_available: int, bytes_per_node: int, max_budget: int = MAX_TREE_NODES - 1) -> int:
    """Largest budget N with ``(N + 1) * bytes_per_node <= bytes_available``; -1 when not even the root fits.

    ``bytes_per_node`` is what one tree node costs across everything sized by the budget (all recurrent layers,
    all running requests). The engine-agnostic core of the start-up check: a serving engine that already knows
    its per-request state size (SGLang's ``mamba_cache_per_req``) calls this and :func:`check_budget_bytes`.
    """
    if bytes_per_node <= 0:
        raise ValueError(f"bytes_per_node must be positive, got {bytes_per_node}")
    return min(int(bytes_available) // int(bytes_per_node) - 1, max_budget)


def check_budget_bytes(budget: int, bytes_available: int, bytes_per_node: int, detail: str = "") -> None:
    """Raise ValueError naming the largest budget that fits when ``budget + 1`` nodes do not fit.

    ``detail`` says where ``bytes_per_node`` comes from (it is quoted in the message, e.g. "0.4 MiB per node per
    layer x 36 layers x 48 requests").
    """
    best = max_budget_for_bytes(bytes_available, bytes_per_node)
    if budget <= best:
        return
    need = (budget + 1) * bytes_per_node
    raise ValueError(
        f"DDTree budget {budget} needs {need / 2**30:.2f} GiB of per-node recurrent states "
        f"({bytes_per_node / 2**20:.3f} MiB per node{' = ' + detail if detail else ''} x {budget + 1} nodes) "
        f"but {bytes_available / 2**30:.2f} GiB are available; the largest budget that fits is {max(best, 0)}"
        + ("" if best >= 0 else " (not even the root fits)")
        + ". Lower the budget or the max running requests, or raise the memory fraction.")


def max_budget_for_memory(bytes_available: int, H: int, K: int, V: int, conv_dim: int, K_conv: int,  # noqa: N803
                          dtype: torch.dtype = torch.float32, *, num_layers: int = 1, batch: int = 1,
                          conv_dtype: torch.dtype | None = None, max_budget: int = MAX_TREE_NODES - 1) -> int:
    """Largest budget N (nodes excluding the root) whose per-node states fit in ``bytes_available``.

    Needs ``(N + 1) * per_node_state_bytes(...) * num_layers * batch <= bytes_available`` (``H`` = value heads,
    ``batch`` = max running requests). Returns -1 when not even the root fits, else a value in [0, max_budget].
    """
    per = per_node_state_bytes(H, K, V, conv_dim, K_conv, dtype, conv_dtype) * max(num_layers, 1) * max(batch, 1)
    return max_budget_for_bytes(bytes_available, per, max_budget)


def check_budget_memory(budget: int, bytes_available: int, H: int, K: int, V: int, conv_dim: int,  # noqa: N803
                        K_conv: int, dtype: torch.dtype = torch.float32, *, num_layers: int = 1, batch: int = 1,
                        conv_dtype: torch.dtype | None = None) -> None:
    """Raise ValueError with the numbers (the start-up error) when ``budget`` does not fit."""
    per = per_node_state_bytes(H, K, V, conv_dim, K_conv, dtype, conv_dtype)
    check_budget_bytes(budget, bytes_available, per * max(num_layers, 1) * max(batch, 1),
                       detail=f"{per / 2**20:.3f} MiB per node per layer x {num_layers} layers x {batch} requests")
