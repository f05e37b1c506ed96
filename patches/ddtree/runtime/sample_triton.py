"""Per-node target tokens in one Triton pass over the vocab (grid = B * N1 rows).

Greedy rows (T < 1e-5) take the first argmax; others take argmax(logits / T + Gumbel) with Philox noise
keyed by a device-side seed drawn from ``generator`` (no host sync, graph-capturable when the generator is a
CUDA generator). The draws differ from the torch reference's RNG stream, so the tests compare greedy rows
exactly and sampled rows by their distribution.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sample_ref import GREEDY_T, temperature_per_request


@triton.jit
def _sample_kernel(logits_ptr, temp_ptr, seed_ptr, out_ptr, N1, V: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b = row // N1
    temp = tl.load(temp_ptr + b)
    greedy = temp < 1e-5
    t = tl.maximum(temp, 1e-5)
    seed = tl.load(seed_ptr) + row
    best_v = float("-inf")
    best_i = tl.program_id(0) * 0
    for v0 in range(0, V, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        inside = cols < V
        x = tl.load(logits_ptr + row * V + cols, mask=inside, other=float("-inf")).to(tl.float32)
        u = tl.rand(seed, cols)
        noisy = x / t - tl.log(-tl.log(u))
        val = tl.where(inside, tl.where(greedy, x, noisy), float("-inf"))
        cmax = tl.max(val)
        carg = tl.argmax(val, axis=0)
        take = cmax > best_v
        best_i = tl.where(take, v0 + carg, best_i)
        best_v = tl.where(take, cmax, best_v)
    tl.store(out_ptr + row, best_i.to(tl.int64))


def sample_target_tokens_triton(target_logits: torch.Tensor, temperature: torch.Tensor | float,
                                generator: torch.Generator | None = None) -> torch.Tensor:
    batch, n1, vocab = target_logits.shape
    dev = target_logits.device
    temp = temperature_per_request(temperature, batch, dev).contiguous()
    gen_dev = generator.device if generator is not None else dev
    seed = torch.randint(0, 1 << 62, (1,), generator=generator, device=gen_dev, dtype=torch.int64).to(dev)
    out = torch.empty((batch, n1), device=dev, dtype=torch.int64)
    _sample_kernel[(batch * n1,)](target_logits.contiguous(), temp, seed, out, n1, V=vocab,
                                  BLOCK=min(4096, triton.next_power_of_2(vocab)), num_warps=8)
    return out


__all__ = ["GREEDY_T", "sample_target_tokens_triton"]
