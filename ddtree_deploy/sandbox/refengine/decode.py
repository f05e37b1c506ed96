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
    budget: int | None = None  # the request's own DDTree budget (``custom_params.ddtree``; 0 = none), None: the server's


@dataclass
class GenerationResult:
    output_ids: list[int]
    finish_reason: dict
    prompt_tokens: int
    verify_rounds: int = 0
    round_commits: list[int] = field(default_factory=list)  # tokens each round put into the output
    round_entries: list[list[int]] = field(default_factory=list)  # per round [budget, accepted, drafted, chain]
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


@dataclass
class AcceptStats:
    """Per-depth, per-rank acceptance as DDTree's cost model needs it (runtime ``schedule.py``'s accept profile).

    ``reached[d]``: rounds whose accepted path reached draft position ``d`` (d accepted tokens before it), so the
    target's token there is known (an accepted draft token, or the bonus token). ``hits[d][r]``: of those, how often
    that token was the drafter's rank-``r`` candidate at position ``d`` (descending logit, ties by token id), for
    ``r < ranks``. ``hits[d][r] / reached[d]`` estimates P(rank r is the target's token | path accepted to d), for
    any budget: the drafter's ranking does not depend on the tree that was built from it."""

    depths: int
    ranks: int = 8
    reached: list[int] = field(default_factory=list)
    hits: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * self.depths
        self.hits = self.hits or [[0] * self.ranks for _ in range(self.depths)]

    def record(self, draft_logits: torch.Tensor, committed: list[int]) -> None:
        """``draft_logits`` [L, V] of the round; ``committed`` = accepted tokens then the bonus token."""
        for d, tok in enumerate(committed[: self.depths]):
            row = draft_logits[d].float()
            ahead = (row > row[tok]).sum() + ((row == row[tok]) & (torch.arange(row.numel()) < tok)).sum()
            self.reached[d] += 1
            if int(ahead) < self.ranks:
                self.hits[d][int(ahead)] += 1

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "depth_reached": list(self.reached), "rank_hits": [list(h) for h in self.hits]}


@dataclass
class Request:
    """One request being decoded: its cache, the committed output and what the next round starts from."""

    params: SamplingParams
    gen: torch.Generator
    cache: KVCache
    out: "_Output"
    result: GenerationResult
    root: int
    ctx_token: int
    ctx_hidden: torch.Tensor
    t0: float

    @property
    def done(self) -> bool:
        return self.out.finish is not None


class Engine:
    """Owns the models and the decoding mode. ``generate`` serves one request alone; ``start`` + ``step`` let a
    scheduler advance several requests round by round, each round at the budget it picks for the batch (a budget of
    0 runs the chain round: one candidate per depth)."""

    def __init__(
        self,
        target: TinyTarget,
        algorithm: str = "NONE",
        runtime: ModuleType | None = None,
        budget: int = 16,
        block_size: int = 8,
        max_budget: int | None = None,
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
        self.max_budget = max(budget, int(max_budget or 0))
        self.block_size = block_size
        self.drafter = BlockDrafter(target, block_size) if algorithm != "NONE" else None
        self.stats = AcceptStats(block_size - 1) if algorithm != "NONE" else None

    @property
    def tree_slots(self) -> int:
        """Verify width of the widest round (root + nodes); the KV cache must have this much headroom."""
        if self.algorithm == "DDTREE":
            return max(self.max_budget + 1, self.block_size)
        if self.algorithm == "DFLASH":
            return self.block_size
        return 1

    def round_width(self, budget: int | None) -> int:
        """Tokens the target verifies in one round at ``budget`` (1 for plain decoding)."""
        if self.algorithm == "NONE":
            return 1
        if self.algorithm == "DFLASH" or not budget:
            return self.block_size
        return int(budget) + 1

    def generate(self, input_ids: list[int], params: SamplingParams, seed: int = 0) -> GenerationResult:
        """Decode one request. ``seed`` drives every random draw, so a (seed, request) pair replays exactly.

        The first token always comes from the prefill logits through the autoregressive sampler, so all
        three algorithms share it; speculative rounds then start from it as their root.
        """
        req = self.start(input_ids, params, seed)
        while not req.done:
            self.step(req, self.budget)
        return req.result

    def start(self, input_ids: list[int], params: SamplingParams, seed: int = 0) -> Request:
        """Prefill a request and commit its first token (the autoregressive sampler's, for every algorithm)."""
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
        req = Request(params, gen, cache, out, result, root, input_ids[-1], hidden[-1], t0)
        self._finish_if_done(req)
        return req

    def step(self, req: Request, budget: int | None = None) -> None:
        """Advance ``req`` by one decoding step: a plain step, or one speculative round at ``budget`` (0 = chain)."""
        if req.done:
            return
        if self.algorithm == "NONE":
            logits, _ = self.target.forward(torch.tensor([req.root]), torch.tensor([req.cache.length]), req.cache)
            req.cache.length += 1
            req.root = sample_ar(logits[-1], req.params.temperature, req.gen)
            req.out.extend([req.root])
        else:
            tokens, req.ctx_token, req.ctx_hidden, entry = self._round(req.cache, req.root, req.ctx_token,
                                                                       req.ctx_hidden, req.params, req.gen, budget)
            req.result.round_entries.append(entry)
            req.result.verify_rounds += 1
            req.result.round_commits.append(req.out.extend(tokens))
            req.root = tokens[-1]
        self._finish_if_done(req)

    @staticmethod
    def _finish_if_done(req: Request) -> None:
        if req.done:
            req.result.finish_reason = req.out.finish or {}
            req.result.seconds = time.perf_counter() - req.t0

    def _round(
        self,
        cache: KVCache,
        root: int,
        ctx_token: int,
        ctx_hidden: torch.Tensor,
        params: SamplingParams,
        gen: torch.Generator,
        budget: int | None = None,
    ) -> tuple[list[int], int, torch.Tensor, list[int]]:
        """One draft -> tree -> verify -> walk -> compaction round; returns committed tokens, the new context feature
        and the round's entry ``[budget, accepted, drafted, chain]`` (the runtime's ``metrics.round_entry``).

        A request's own budget (``params.budget``) below the round's cuts its tree to its best nodes after the verify
        (the runtime's ``prune_tree``, as the SGLang patch set does): what a round at that budget commits, 0 = the
        root alone. A chain round is the chain whatever the request asked (as SGLang's own chain code runs it)."""
        rt = self.runtime
        draft_logits = self.drafter.draft(root, cache.length, ctx_token, ctx_hidden)[None]  # [1, L, V]
        vocab = draft_logits.shape[-1]
        budget = self.budget if budget is None else int(budget)
        chain = self.algorithm == "DFLASH" or budget == 0
        if chain:
            k, budget = 1, self.drafter.depths  # one candidate per depth: the top-1 chain
        else:
            k = min(budget, vocab)
        lp, tok = rt.draft_topk(draft_logits, k, impl="auto")
        tree = rt.build_tree(lp, tok, torch.tensor([root], dtype=torch.long), budget, impl="auto")
        own = budget if chain or params.budget is None else min(int(params.budget), budget)
        committed = torch.tensor([cache.length], dtype=torch.long)
        vin = rt.build_verify_inputs(tree, committed, impl="auto")
        n1 = tree.token.shape[1]
        logits, hidden = self.target.forward(tree.token[0], vin.positions[0], cache, vin.mask[0])
        target_tokens = rt.sample_target_tokens(logits[None], float(params.temperature), generator=gen, impl="auto")
        if own < budget:
            tree = rt.prune_tree(tree, torch.tensor([own]))
        walk = rt.accept_walk(tree, target_tokens, impl="auto")
        slots = (cache.length + torch.arange(n1, dtype=torch.long))[None]
        src, dst = rt.kv_compaction(walk, slots, impl="auto")
        accepted = int(walk.accept_len[0])
        valid = src[0] >= 0
        cache.move(src[0][valid], dst[0][valid])
        cache.length += accepted + 1
        last_node = int(walk.accepted_nodes[0, accepted])
        tokens = [int(t) for t in walk.accepted_tokens[0, : accepted + 1]]
        if self.stats is not None:
            self.stats.record(draft_logits[0], tokens)
        entry = [0 if chain else own, accepted, budget if chain else own, int(chain)]
        return tokens, int(tree.token[0, last_node]), hidden[last_node], entry
