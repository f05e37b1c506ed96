"""Tiny seeded models: a causal transformer target and a DFlash-style block drafter.

Why tiny and seeded: every sandbox host must build bit-identical models with no download, so a
recorded temperature-0 baseline stays valid across hosts and restarts. Why float64: tree verify
computes the same logits as sequential decoding but with a different reduction order; in float64
that noise (~1e-15) cannot flip an argmax of this model in practice, so "DDTree greedy equals
autoregressive greedy" is a property of the design, not a tolerance in a test.

Why the drafter is derived from the target: random weights would accept almost nothing. The
drafter uses the target's own one-token transition (the target run on each token with no
context, tabulated once) plus the target's hidden feature of the last committed token, which
carries the context's effect forward. It therefore agrees with the target often but not
always, which is what gives DDTree's extra branches something to win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class ModelConfig:
    """Shape and character of the tiny models; the defaults give acceptance well above 1."""

    vocab_size: int = VOCAB_SIZE
    hidden: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_mult: int = 4
    attn_gain: float = 0.3  # scale of each attention output: how much context moves the next token
    logit_scale: float = 5.0  # std of logits: higher = more peaked next-token distributions
    rope_theta: float = 10000.0
    abs_pos_scale: float = 1.0  # absolute sinusoidal position signal added to embeddings (breaks greedy cycles)
    context_carry: float = 0.5  # drafter: weight of the target's context feature, decayed per depth
    seed: int = 0


class KVCache:
    """Preallocated per-request KV store; ``length`` counts committed tokens.

    A forward writes its K/V at slots ``length .. length+T-1`` and never moves ``length``: the
    caller commits (autoregressive step) or compacts the accepted tree path first (speculative
    round), mirroring how SGLang's verify writes every node and keeps only the accepted ones.
    """

    def __init__(self, cfg: ModelConfig, max_len: int, dtype: torch.dtype) -> None:
        head_dim = cfg.hidden // cfg.n_heads
        shape = (cfg.n_layers, max_len, cfg.n_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.length = 0
        self.max_len = max_len

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V slots src -> dst (1-D, same length); gathers first, so overlap is safe."""
        if src.numel() == 0:
            return
        self.k[:, dst] = self.k[:, src].clone()
        self.v[:, dst] = self.v[:, src].clone()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _abs_pos(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal absolute position signal [T, dim] with slow frequencies (periods 24..~2400 tokens)."""
    half = dim // 2
    periods = 24.0 * (100.0 ** (torch.arange(half, dtype=dtype) / max(half - 1, 1)))
    angles = positions.to(dtype)[:, None] * (2 * math.pi / periods)[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [T, H, Dh] at integer positions [T] (rotate-half convention)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=x.dtype) / half)
    angles = positions.to(x.dtype)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class TinyTarget:
    """Pre-norm causal transformer with RoPE and a KV cache; batch 1 (the engine serves one request at a time)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float64) -> None:
        if cfg.hidden % cfg.n_heads or (cfg.hidden // cfg.n_heads) % 2:
            raise ValueError("hidden must split into heads of even size")
        self.cfg = cfg
        self.dtype = dtype
        g = torch.Generator().manual_seed(cfg.seed)
        d, v, m = cfg.hidden, cfg.vocab_size, cfg.hidden * cfg.mlp_mult

        def rnd(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).to(dtype)

        self.embed = rnd(v, d, std=1.0)
        self.layers = []
        for _ in range(cfg.n_layers):
            self.layers.append(
                {
                    "norm1": torch.ones(d, dtype=dtype),
                    "wq": rnd(d, d, std=d**-0.5),
                    "wk": rnd(d, d, std=d**-0.5),
                    "wv": rnd(d, d, std=d**-0.5),
                    "wo": rnd(d, d, std=cfg.attn_gain * d**-0.5),
                    "norm2": torch.ones(d, dtype=dtype),
                    "w1": rnd(d, m, std=d**-0.5),
                    "w2": rnd(m, d, std=0.5 * m**-0.5),
                }
            )
        self.final_norm = torch.ones(d, dtype=dtype)
        self.lm_head = rnd(d, v, std=cfg.logit_scale * d**-0.5)
        self._pos_table = torch.zeros(0, d, dtype=dtype)

    def new_cache(self, max_len: int) -> KVCache:
        return KVCache(self.cfg, max_len, self.dtype)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return _rms_norm(hidden, self.final_norm) @ self.lm_head

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run T new tokens over the cached prefix; returns (logits [T, V], hidden [T, D]).

        ``mask`` [T, T] (bool, True = visible) says which new tokens each new token sees; None means
        causal. Every cached (committed) token is visible to all new tokens. K/V of the new tokens
        are written at slots cache.length.. and the cache length is left unchanged.
        """
        cfg = self.cfg
        t = tokens.shape[0]
        start = cache.length
        if start + t > cache.max_len:
            raise ValueError(f"KV cache full: {start} + {t} > {cache.max_len}")
        if mask is None:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
        full_mask = torch.cat([torch.ones(t, start, dtype=torch.bool), mask], dim=1)  # [T, S+T]
        n_h, h_d = cfg.n_heads, cfg.hidden // cfg.n_heads
        x = self.embed_at(tokens, positions)
        for li, p in enumerate(self.layers):
            h = _rms_norm(x, p["norm1"])
            q = _rope((h @ p["wq"]).view(t, n_h, h_d), positions, cfg.rope_theta)
            k = _rope((h @ p["wk"]).view(t, n_h, h_d), positions, cfg.rope_theta)
            cache.k[li, start : start + t] = k
            cache.v[li, start : start + t] = (h @ p["wv"]).view(t, n_h, h_d)
            keys, values = cache.k[li, : start + t], cache.v[li, : start + t]
            scores = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(h_d)
            scores = scores.masked_fill(~full_mask[None], float("-inf"))
            attn = torch.einsum("hts,shd->thd", scores.softmax(-1), values).reshape(t, cfg.hidden)
            x = x + attn @ p["wo"]
            h = _rms_norm(x, p["norm2"])
            x = x + torch.nn.functional.silu(h @ p["w1"]) @ p["w2"]
        return self.logits_from_hidden(x), x

    def embed_at(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed[tokens]
        if self.cfg.abs_pos_scale:
            need = int(positions.max()) + 1
            if need > self._pos_table.shape[0]:  # grow geometrically; values do not depend on the table size
                size = max(need, 2 * self._pos_table.shape[0])
                self._pos_table = self.cfg.abs_pos_scale * _abs_pos(torch.arange(size), self.cfg.hidden, self.dtype)
            x = x + self._pos_table[positions]
        return x

    @torch.inference_mode()
    def isolated_hidden(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._isolated(tokens, positions)

    def _isolated(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden state [T, D] of each token run alone (no context) at its position.

        With a single visible token, attention's softmax weight is 1, so the attention output is
        just that token's value projection; RoPE does not touch values. Row i therefore equals
        ``forward`` on the one-token sequence tokens[i] at positions[i] (a test checks this).
        """
        x = self.embed_at(tokens, positions)
        for p in self.layers:
            h = _rms_norm(x, p["norm1"])
            x = x + (h @ p["wv"]) @ p["wo"]
            h = _rms_norm(x, p["norm2"])
            x = x + torch.nn.functional.silu(h @ p["w1"]) @ p["w2"]
        return x


class BlockDrafter:
    """DFlash-style drafter: one call proposes logits for all L = block_size - 1 depths.

    Input is what a DFlash drafter gets: the root (last committed, not yet verified) token and the
    target's hidden feature of the last verified context token. Depth d's logits come from the
    target's isolated transition of the depth-(d-1) spine token plus the context residual
    (target hidden in context minus isolated hidden), decayed by ``context_carry ** d``. The spine
    is the greedy path through those logits, as a diffusion drafter's per-depth marginals would be.
    """

    def __init__(self, target: TinyTarget, block_size: int) -> None:
        if block_size < 2:
            raise ValueError("block_size must be >= 2 (at least one draft depth)")
        self.target = target
        self.depths = block_size - 1
        self.carry = target.cfg.context_carry

    @torch.inference_mode()
    def draft(self, root_token: int, root_pos: int, ctx_token: int, ctx_hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits [L, V] for depths 1..L below ``root_token`` (at position ``root_pos``)."""
        iso = self.target._isolated  # already under inference_mode
        residual = ctx_hidden - iso(torch.tensor([ctx_token]), torch.tensor([root_pos - 1]))[0]
        out = []
        tok = root_token
        for d in range(1, self.depths + 1):
            hidden = iso(torch.tensor([tok]), torch.tensor([root_pos + d - 1]))[0] + (self.carry**d) * residual
            logits = self.target.logits_from_hidden(hidden)
            out.append(logits)
            tok = int(logits.argmax())
        return torch.stack(out)


_CACHE: dict[tuple[ModelConfig, str], TinyTarget] = {}


def build_target(cfg: ModelConfig, dtype: torch.dtype = torch.float64) -> TinyTarget:
    """Build (or reuse) the target for ``cfg``: construction is deterministic, so reuse is safe."""
    key = (cfg, str(dtype))
    if key not in _CACHE:
        _CACHE[key] = TinyTarget(cfg, dtype)
    return _CACHE[key]
