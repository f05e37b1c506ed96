"""Generation loops: autoregressive, DFlash chain and DDTree, all on one KV-cache convention.

Convention: the cache holds every committed token except the newest one (the "root"), whose
logits have not been computed yet. An autoregressive step feeds the root; a speculative round
feeds the root plus the drafted tree in ONE target forward (ancestor mask, depth positions over
the cached prefix), samples one target token per node, walks the tree, and keeps only the
accepted path's K/V. The tree maths (top-k, build, verify inputs, sampling, walk, compaction)
comes from the DDTree runtime module passed in, so decoding exercises the overlay's own code.
The chain is the same machinery with one candidate per depth, so chain and tree differ only in
the tree the runtime builds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType

import torch

from .models import BlockDrafter, KVCache, TinyTarget

ALGORITHMS = ("NONE", "DFLASH", "DDTREE")
GREEDY_EPS = 1e-5  # same threshold as the runtime's sample_target_tokens


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class GenerationResult:
    output_ids: list[int]
    finish_reason: dict
    prompt_tokens: int
    verify_rounds: int = 0
    round_commits: list[int] = field(default_factory=list)  # tokens each round put into the output
    seconds: float = 0.0

    @property
    def accept_length(self) -> float:
        """Mean tokens committed per verify round (accepted drafts + bonus); 1.0 without speculation."""
        if not self.verify_rounds:
            return 1.0
        return sum(self.round_commits) / self.verify_rounds


def sample_ar(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """One autoregressive draw from logits [V]: argmax when greedy, else softmax(logits / T).

    Greedy takes the argmax of the fp32-rounded logits, as the runtime's sample_target_tokens does,
    so both paths apply the same rounding before comparing candidates.
    """
    if temperature < GREEDY_EPS:
        return int(logits.float().argmax())
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class _Output:
    """Accumulates committed tokens and applies stop tokens / max_new_tokens truncation."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.ids: list[int] = []
        self.finish: dict | None = None

    def extend(self, tokens: list[int]) -> int:
        """Append tokens until a stop condition; returns how many were kept."""
        kept = 0
        for tok in tokens:
            if self.finish is not None:
                break
            self.ids.append(tok)
            kept += 1
            if tok in self.params.stop_token_ids:
                self.finish = {"type": "stop", "matched": tok}
            elif len(self.ids) >= self.params.max_new_tokens:
                self.finish = {"type": "length", "length": self.params.max_new_tokens}
        return kept


class Engine:
    """Owns the models and the decoding mode; ``generate`` serves one request (batch 1)."""

    def __init__(
        self,
        target: TinyTarget,
        algorithm: str = "NONE",
        runtime: ModuleType | None = None,
        budget: int = 16,
        block_size: int = 8,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {algorithm!r}; expected one of {ALGORITHMS}")
        if algorithm != "NONE" and runtime is None:
            raise ValueError(f"{algorithm} needs the DDTree runtime module")
        if budget < 1:
            raise ValueError("ddtree budget must be >= 1")
        self.target = target
        self.algorithm = algorithm
        self.runtime = runtime
        self.budget = budget
        self.block_size = block_size
        self.drafter = BlockDrafter(target, block_size) if algorithm != "NONE" else None

    @property
    def tree_slots(self) -> int:
        """Verify width of one round (root + nodes); the KV cache must have this much headroom."""
        if self.algorithm == "DDTREE":
            return self.budget + 1
        if self.algorithm == "DFLASH":
            return self.block_size
        return 1

    def generate(self, input_ids: list[int], params: SamplingParams, seed: int = 0) -> GenerationResult:
        """Decode one request. ``seed`` drives every random draw, so a (seed, request) pair replays exactly.

        The first token always comes from the prefill logits through the autoregressive sampler, so all
        three algorithms share it; speculative rounds then start from it as their root.
        """
        if not input_ids:
            raise ValueError("input_ids must not be empty")
        vocab = self.target.cfg.vocab_size
        if any(not 0 <= i < vocab for i in input_ids):
            raise ValueError(f"input ids must lie in [0, {vocab})")
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(seed)
        cache = self.target.new_cache(len(input_ids) + params.max_new_tokens + self.tree_slots + 1)
        prompt = torch.tensor(input_ids, dtype=torch.long)
        logits, hidden = self.target.forward(prompt, torch.arange(len(input_ids)), cache)
        cache.length = len(input_ids)
        out = _Output(params)
        root = sample_ar(logits[-1], params.temperature, gen)
        out.extend([root])
        result = GenerationResult(output_ids=out.ids, finish_reason={}, prompt_tokens=len(input_ids))
        if self.algorithm == "NONE":
            while out.finish is None:
                logits, _ = self.target.forward(torch.tensor([root]), torch.tensor([cache.length]), cache)
                cache.length += 1
                root = sample_ar(logits[-1], params.temperature, gen)
                out.extend([root])
        else:
            ctx_token, ctx_hidden = input_ids[-1], hidden[-1]
            while out.finish is None:
                tokens, ctx_token, ctx_hidden = self._round(cache, root, ctx_token, ctx_hidden, params, gen)
                result.verify_rounds += 1
                result.round_commits.append(out.extend(tokens))
                root = tokens[-1]
        result.finish_reason = out.finish or {}
        result.seconds = time.perf_counter() - t0
        return result

    def _round(
        self,
        cache: KVCache,
        root: int,
        ctx_token: int,
        ctx_hidden: torch.Tensor,
        params: SamplingParams,
        gen: torch.Generator,
    ) -> tuple[list[int], int, torch.Tensor]:
        """One draft -> tree -> verify -> walk -> compaction round; returns committed tokens and the new context feature."""
        rt = self.runtime
        draft_logits = self.drafter.draft(root, cache.length, ctx_token, ctx_hidden)[None]  # [1, L, V]
        vocab = draft_logits.shape[-1]
        if self.algorithm == "DFLASH":
            k, budget = 1, self.drafter.depths  # one candidate per depth: the top-1 chain
        else:
            k, budget = min(self.budget, vocab), self.budget
        lp, tok = rt.draft_topk(draft_logits, k, impl="auto")
        tree = rt.build_tree(lp, tok, torch.tensor([root], dtype=torch.long), budget, impl="auto")
        committed = torch.tensor([cache.length], dtype=torch.long)
        vin = rt.build_verify_inputs(tree, committed, impl="auto")
        n1 = tree.token.shape[1]
        logits, hidden = self.target.forward(tree.token[0], vin.positions[0], cache, vin.mask[0])
        target_tokens = rt.sample_target_tokens(logits[None], float(params.temperature), generator=gen, impl="auto")
        walk = rt.accept_walk(tree, target_tokens, impl="auto")
        slots = (cache.length + torch.arange(n1, dtype=torch.long))[None]
        src, dst = rt.kv_compaction(walk, slots, impl="auto")
        accepted = int(walk.accept_len[0])
        valid = src[0] >= 0
        cache.move(src[0][valid], dst[0][valid])
        cache.length += accepted + 1
        last_node = int(walk.accepted_nodes[0, accepted])
        tokens = [int(t) for t in walk.accepted_tokens[0, : accepted + 1]]
        return tokens, int(tree.token[0, last_node]), hidden[last_node]
