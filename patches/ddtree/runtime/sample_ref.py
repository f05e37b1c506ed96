"""Target-token selection in plain torch: one token per tree node.

Lossless at T > 0: each node gets one independent draw from softmax(logits / T) (Gumbel-max), and the walk
commits target draws only, so committed tokens are distributed exactly as autoregressive sampling.
"""
from __future__ import annotations

import torch

GREEDY_T = 1e-5


def temperature_per_request(temperature: torch.Tensor | float, batch: int, device: torch.device) -> torch.Tensor:
    """Broadcast a float or [B] tensor of temperatures to fp32 [B] on ``device``."""
    if isinstance(temperature, torch.Tensor):
        return temperature.to(device=device, dtype=torch.float32).reshape(-1).expand(batch)
    return torch.full((batch,), float(temperature), device=device, dtype=torch.float32)


def sample_target_tokens_torch(target_logits: torch.Tensor, temperature: torch.Tensor | float,
                               generator: torch.Generator | None = None) -> torch.Tensor:
    """[B, N1, V] -> int64 [B, N1]: argmax where T < 1e-5, else argmax(logits / T + Gumbel noise)."""
    batch = target_logits.shape[0]
    x = target_logits.float()
    greedy = x.argmax(-1)
    if not isinstance(temperature, torch.Tensor) and float(temperature) < GREEDY_T:
        return greedy
    temp = temperature_per_request(temperature, batch, x.device)
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    gumbel = -torch.log(-torch.log(u))
    sampled = (x / temp.clamp(min=GREEDY_T).view(batch, 1, 1) + gumbel).argmax(-1)
    return torch.where((temp < GREEDY_T).view(batch, 1), greedy, sampled)
