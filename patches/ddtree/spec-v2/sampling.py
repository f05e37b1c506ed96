"""One target token per tree node, which the walk compares with the node's children.

Greedy batches take the argmax. Otherwise every node gets one independent draw from its request's own law at
that node's context (temperature, then top-k / top-p / min-p as SGLang's torch sampler applies them); a greedy
request inside a mixed batch has top-k 1, i.e. its argmax. Committing the walk's path of such draws is an exact
sample of the target (the DDTree paper's lossless verification), whatever the drafter proposed.
"""
from __future__ import annotations

from typing import Any

import torch


def _per_node(t: torch.Tensor, n1: int) -> torch.Tensor:
    return torch.repeat_interleave(t.reshape(-1), n1, dim=0)


def target_tokens_per_node(logits: torch.Tensor, sampling_info: Any, bs: int, n1: int,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """int64 [bs, n1] from ``logits`` [bs * n1, V] (already adjusted: penalties, bias, grammar)."""
    if sampling_info is None or sampling_info.is_all_greedy:
        return torch.argmax(logits, dim=-1).view(bs, n1)
    temps = _per_node(sampling_info.temperatures.to(torch.float32), n1).view(-1, 1)
    scaled = logits.float() / temps
    if not (sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling
            or sampling_info.need_min_p_sampling):
        # Plain temperature sampling: Gumbel-max over the scaled logits draws exactly from softmax(x / T)
        # without sorting the vocabulary.
        u = torch.empty_like(scaled).uniform_(generator=generator) if generator is not None \
            else torch.rand_like(scaled)
        gumbel = -torch.log(-torch.log(u.clamp_(min=torch.finfo(torch.float32).tiny)))
        return torch.argmax(scaled + gumbel, dim=-1).view(bs, n1)
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    probs = torch.softmax(scaled, dim=-1)
    ids = top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        _per_node(sampling_info.top_ks, n1),
        _per_node(sampling_info.top_ps, n1),
        _per_node(sampling_info.min_ps, n1),
        sampling_info.need_min_p_sampling,
        None,
        None,
    )
    return ids.to(torch.int64).view(bs, n1)
