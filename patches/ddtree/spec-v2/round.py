"""A DDTree decode round on the spec-v2 DFlash worker, from the draft forward's output to the scheduler's result.

The base worker prepares the draft block (``[bonus, MASK x L]`` at positions ``prefix + j``) and runs the drafter,
unchanged. From there DDTree differs from the chain:

1. **Tree** (:mod:`.draft_topk`): per-depth top-k, best-first tree of ``budget`` nodes, ancestor masks; read from
   the draft CUDA graph's buffers when the draft ran as a graph, else built eagerly.
2. **Verify**: the N1 = budget + 1 nodes go into KV slots ``req_to_token[prefix : prefix + N1]`` (reserved by the
   scheduler, see ``config.kv_reservation``) at depth positions, with the ancestor mask written into the target
   backend's own verify-mask buffer (tree block only where the backend skips the context columns); one
   TARGET_VERIFY forward, eager or as the target's CUDA graph.
3. **Walk**: one target token per node (:mod:`.sampling`), then the runtime's acceptance walk.
4. **Commit**: the accepted path's slots move to the front of the verify range by permuting ``req_to_token``
   (no KV copy; with page size > 1, where positions must stay in their pages, the path's KV rows are copied to the
   slots of their positions instead, one launch for every layer); the drafter's context gets the target hidden states of exactly those nodes at positions
   ``prefix + j``. The result has the chain's shape (``block_size`` tokens per request, ``accept_lens``), so the
   overlap scheduler, its future map and its stop-token handling are the base's.

Nothing here waits for the GPU: sizes come from host bounds the scheduler already keeps (the committed lengths,
at most one round stale, plus one block), never from device values.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Callable, Optional

import torch

from .compat import base_name, next_draft_input_decode
from .adapt import Adaptation
from .backends import BACKENDS, PROVEN, REFUSED, name_of_class
from .config import UNPROVEN_FLAG, adapt_on, enabled, hysteresis, max_verify_width, resolved, schedule_of
from .draft_schedule import ScheduledDraftHead, chain_head
from .draft_topk import DraftTreeBuilder, DraftTreeOut, runtime
from .graph_widths import pad_to_captured
from .metrics import RoundMetrics
from .request_budget import caps_tensor, round_caps
from .sampling import target_tokens_per_node
from .verify_input import DDTreeVerifyInput
from .verify_attention import choice as verify_attention_choice, install as install_verify_attention

logger = logging.getLogger(__name__)


def tp_size(worker: Any) -> int:
    """The worker's tensor-parallel size: its ParallelState (0.5.16+), else its server arguments (0.5.14/15 keep
    only ``tp_rank`` on the worker)."""
    ps = getattr(worker, "ps", None)
    if ps is not None:
        return int(getattr(ps, "tp_size", 1) or 1)
    return int(getattr(worker.server_args, "tp_size", 1) or 1)


def full_attention_backend(backend: Any) -> Any:
    """The backend that runs full attention (hybrid wrappers keep it as ``full_attn_backend``)."""
    for _ in range(4):
        inner = getattr(backend, "full_attn_backend", None)
        if inner is None:
            break
        backend = inner
    return backend


def paged_kv_rows(model_runner: Any) -> Any:
    """The target's KV buffers whose rows a paged commit copies (every attention layer's K and V; a hybrid's come
    from its full-attention pool), checked: token-major rows of one dtype, no extra per-row scale buffers. A
    ValueError says why not."""
    pool = model_runner.token_to_kv_pool
    pool = getattr(pool, "full_kv_pool", None) or pool
    layout = getattr(pool, "kv_cache_layout", "nhd")
    if layout != "nhd" or getattr(pool, "use_hnd", False):
        raise ValueError(f"{type(pool).__name__} keeps its KV in the {layout!r} layout; DDTree's commit copies "
                         "token-major (NHD) rows")
    if getattr(pool, "k_scale_buffer", None) is not None:
        raise ValueError(f"{type(pool).__name__} keeps per-row scales beside its KV, which the commit does not copy")
    k, v = getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None)
    if not k or not v:
        raise ValueError(f"{type(pool).__name__} has no per-layer k_buffer / v_buffer lists")
    return runtime().KVRows(list(k) + list(v))


class DDTreeRound:
    """DDTree state of one DFlash worker: widths, the draft tree builder, and the decode round after the draft."""

    def __init__(self, server_args: Any, *, block_size: int):
        self.schedule = schedule_of(server_args)
        self.max_budget = int(self.schedule.max_budget)
        self.budget = self.max_budget  # this round's budget (a schedule picks it per round: tree_round)
        self.n1 = self.budget + 1
        self.block = int(block_size)
        self.depth = self.block - 1
        self.adapt_on = adapt_on(server_args)
        self.adapt: Optional[Adaptation] = None  # made at the first round (needs the capture sizes, the device)
        self.has_chain = 0 in self.schedule.budgets or self.adapt_on
        # a change of budget waits until the decode batch has wanted it `hold` rounds in a row (tree_round)
        self.hysteresis = hysteresis(server_args)
        self.allow_unproven = bool(getattr(server_args, "speculative_ddtree_allow_unproven", False))
        self.backend_name = "triton"
        self.prefix_cols = False
        self.hybrid = False  # a GatedDeltaNet hybrid target whose recurrent state branches over the tree (.hybrid)
        self.kv_rows: Any = None  # page size > 1: the target's KV buffers the commit copies the path's rows in
        # the head folded into the draft graph, if any: one tree builder (a single budget), or per-size heads
        self.builder: Optional[DraftTreeBuilder | ScheduledDraftHead] = None
        self._eager: dict[int, DraftTreeBuilder] = {}
        self._capture_bs: Optional[list[int]] = None
        self.rounds = 0
        self.chain_rounds = 0
        # acceptance metrics (meta_info, /metrics with SGLang's --enable-metrics): .metrics
        self.metrics = RoundMetrics(block_size=self.block,
                                    export=bool(getattr(resolved(server_args), "enable_metrics", False)))

    @classmethod
    def for_worker(cls, server_args: Any, *, block_size: int) -> Optional["DDTreeRound"]:
        """None when DDTree is off; else the round state, after the worker-level start-up checks."""
        if not enabled(server_args):
            return None
        from .plugin import require_applied

        require_applied("the DFLASH worker")
        schedule = schedule_of(server_args)
        width = max_verify_width(schedule, block_size, with_chain=adapt_on(server_args))
        n = resolved(server_args).speculative_num_draft_tokens
        if int(n) != width:
            raise RuntimeError("DDTree verify width must be the schedule's widest (budget + 1, or the block at "
                               f"budget 0): speculative_num_draft_tokens={n}, "
                               f"schedule {schedule}, block {block_size} -> {width} (were the server arguments "
                               "resolved?)")
        return cls(server_args, block_size=block_size)

    # -- start-up ------------------------------------------------------------------------------------------------
    def check_target(self, model_runner: Any, *, is_hybrid: bool, worker: Any = None) -> None:
        """Refuse, at worker start, what the server arguments could not see: the backend class actually built, a
        hybrid linear-attention target, sliding-window attention in the target, a DFlash2 drafter (``worker``: the
        DFLASH worker, on the bases whose series pass it)."""
        problems = []
        unproven = []
        if getattr(worker, "selector", None) is not None:  # 0.5.19+: DFlash2's candidate selector
            problems.append("a DFlash2 drafter (its candidate selector drafts a top-k lattice per position; DDTree "
                            "builds its tree from the target LM head's top-k over DFlash1 drafter states and does "
                            "not read the selector's candidates: use a DFlash1 drafter, or run DFLASH without "
                            "--speculative-ddtree-budget)")
        if getattr(worker, "_is_domino", False):  # 0.5.20+: a Domino drafter's GRU rollout
            problems.append("a Domino drafter (its draft tokens come from a prefix-GRU rollout over the target's "
                            "embeddings, not from per-position logits DDTree can take a top-k of: run DFLASH without "
                            "--speculative-ddtree-budget)")
        backend = full_attention_backend(model_runner.attn_backend)
        cls_name = type(backend).__name__
        name = name_of_class(cls_name)  # the backends table, backends.py
        row = BACKENDS.get(name)
        if row is None:
            problems.append(f"the target's attention backend {cls_name} (DDTree needs a tree mask: use "
                            "--attention-backend triton)")
        elif row.status == REFUSED:
            problems.append(f"the {name} attention backend ({row.reason}; use --attention-backend triton)")
        elif row.status != PROVEN:
            unproven.append(f"the {name} attention backend ({row.reason})")
        if is_hybrid:  # GatedDeltaNet hybrids run by default (SGLang 0.5.17, patch 0004); the rest refused with why
            from .hybrid import target_problems

            hybrid_problems = target_problems(model_runner)
            problems += hybrid_problems
            self.hybrid = not hybrid_problems
        swa = getattr(model_runner, "sliding_window_size", None)
        if swa is not None and int(swa) > 0:
            problems.append(f"a target with sliding-window attention (window {swa}): the triton kernel reads the "
                            "mask at window offsets that DDTree does not write")
        page_size = int(getattr(model_runner, "page_size", None) or getattr(getattr(model_runner, "server_args",
                                                                                      None), "page_size", 1) or 1)
        if page_size > 1:  # positions stay in their pages: the commit copies the path's KV rows (runtime move_path_kv)
            try:
                self.kv_rows = paged_kv_rows(model_runner)
            except ValueError as exc:
                problems.append(f"--page-size {page_size} with this KV cache ({exc})")
        if problems:
            raise ValueError("DDTree (--speculative-ddtree-budget) does not support " + "; ".join(problems) + ".")
        if unproven and not self.allow_unproven:
            raise ValueError("DDTree (--speculative-ddtree-budget) is not proven with " + "; ".join(unproven)
                             + f". Pass {UNPROVEN_FLAG} to run it anyway.")
        self.backend_name = name
        self.prefix_cols = row.reads_context_columns
        if name == "triton":  # DDTREE_VERIFY_ATTN=ddtree: tree verifies through DDTree's attention kernel
            install_verify_attention(backend, runtime().tree_verify_attention)
        else:
            verify_attention_choice()  # a bad value is refused whatever the backend

    def draft_builder(self, *, lm_head: Any, vocab_size: int, max_bs: int, tp_group: Any, device: Any,
                      chain_head_cls: Any = None) -> DraftTreeBuilder | ScheduledDraftHead:
        """The head folded into the draft CUDA graph (warmed up here, before any capture): the tree builder of
        the budget, or with a schedule one builder per tree budget plus the base's greedy head
        (``chain_head_cls``) for the chain's sizes (:mod:`.draft_schedule`)."""
        def tree(budget: int) -> DraftTreeBuilder:
            b = DraftTreeBuilder(lm_head=lm_head, block_size=self.block, budget=budget, vocab_size=vocab_size,
                                 max_bs=max_bs, tp_group=tp_group, device=device)
            b.warm_up(device)
            return b

        if self.schedule.is_single and not self.adapt_on:
            self.builder = tree(self.max_budget)
            logger.info("DDTree draft top-k and tree build folded into the draft cuda graph (budget=%d, k=%d, "
                        "max_bs=%d).", self.max_budget, self.builder.k, max_bs)
            return self.builder
        chain = None
        if self.has_chain:
            if chain_head_cls is None:
                raise RuntimeError(f"DDTree schedule {self.schedule}: the base gave no greedy head for its chain "
                                   "sizes")
            chain = chain_head(chain_head_cls, lm_head=lm_head, block_size=self.block, max_bs=max_bs,
                               tp_group=tp_group)
        trees = {b: tree(b) for b in self.schedule.budgets if b > 0}
        self.builder = ScheduledDraftHead(schedule=self.schedule, block_size=self.block, trees=trees, chain=chain,
                                          also_chain=self.adapt_on)
        logger.info("DDTree draft heads folded into the draft cuda graph per batch size (schedule %s, max_bs=%d).",
                    self.schedule, max_bs)
        return self.builder

    # -- which budget this round --------------------------------------------------------------------------------
    def capture_sizes(self, worker: Any) -> Optional[list[int]]:
        """The batch sizes the decode graphs were captured at (the draft's, else the target's; None eagerly). The
        draft graph's tail at the padded size built that size's tree, so its list decides. Should the target's
        list differ, a round whose padded sizes disagree finds a different width in the target's graph and its
        verify runs eagerly (correct, slower): logged once."""
        if self._capture_bs is None:
            lists = {}
            for key, mr in (("draft", getattr(worker, "draft_model_runner", None)),
                            ("target", getattr(worker, "model_runner", None))):
                runner = getattr(mr, "decode_cuda_graph_runner", None) if mr is not None else None
                sizes = getattr(runner, "capture_bs", None) if runner is not None else None
                if sizes:
                    lists[key] = sorted(int(s) for s in sizes)
            if len(lists) == 2 and lists["draft"] != lists["target"]:
                logger.warning("DDTree schedule %s: the target's decode graphs were captured at batch sizes %s but "
                               "the draft's at %s; budgets follow the draft's sizes, and verifies whose padded size "
                               "differs run eagerly", self.schedule, lists["target"], lists["draft"])
            self._capture_bs = lists.get("draft") or lists.get("target") or []
        return self._capture_bs

    def runnable(self, padded: int, sizes: Optional[list[int]]) -> set[int]:
        """The budgets a round at the padded size ``padded`` can run. A captured size replays the graphs captured at
        start-up: the draft graph's tail there built the tree of its own budget only (or ran the chain's head), and
        the target's graph there has that width (``draft_schedule``, ``graph_widths``); with adaptation the chain's
        too. Eagerly (no graphs, or a batch above the largest captured size) any budget of the schedule."""
        chain = {0} if self.adapt_on else set()
        if sizes and padded in sizes:
            return {int(self.schedule.budget_for(padded))} | chain
        return set(self.schedule.budgets) | chain

    def tree_round(self, worker: Any, bs: int) -> bool:
        """Pick this round's budget from the padded (captured) size of the decode batch (this is called for decode
        rounds only, never for a prefill), before anything is built: the schedule's (or the adaptation's) budget for
        it, through the hysteresis (a change waits until it was wanted ``--speculative-ddtree-schedule-hold`` rounds
        in a row, among the budgets this round can run: :meth:`runnable`). True for a tree round; False = budget 0,
        the stock chain round runs (its draft head, causal verify and commit)."""
        if self.schedule.is_single and not self.adapt_on:
            self.metrics.begin(bs, self.budget)
            return True
        sizes = self.capture_sizes(worker)
        padded = pad_to_captured(bs, sizes)
        budget = int(self.schedule.budget_for(padded))
        if self.adapt_on:
            if self.adapt is None:
                self.adapt = Adaptation(schedule=self.schedule, block_size=self.block,
                                        sizes=sizes or range(1, 257), device=worker.device)
            self.adapt.tick()
            budget = self.adapt.budget_for(padded, budget)
        budget = int(self.hysteresis.step(budget, self.runnable(padded, sizes)))
        self.budget, self.n1 = budget, budget + 1
        if budget == 0:
            self.chain_rounds += 1
        self.metrics.begin(bs, budget)
        return budget > 0

    def _eager_builder(self, *, lm_head: Any, vocab_size: int, tp_group: Any, device: Any) -> DraftTreeBuilder:
        if self.budget not in self._eager:
            self._eager[self.budget] = DraftTreeBuilder(lm_head=lm_head, block_size=self.block, budget=self.budget,
                                                        vocab_size=vocab_size, max_bs=0, tp_group=tp_group,
                                                        device=device)
        return self._eager[self.budget]

    # -- the round -----------------------------------------------------------------------------------------------
    def draft_tree(self, *, draft_out: Any, root_tokens: torch.Tensor, from_graph: bool, lm_head: Any,
                   vocab_size: int, tp_group: Any, device: Any) -> DraftTreeOut:
        bs = int(root_tokens.shape[0])
        if from_graph and isinstance(self.builder, ScheduledDraftHead):
            return self.builder.read(self.budget, bs, root_tokens)
        if from_graph and self.builder is not None:
            return self.builder.read(bs, root_tokens)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH draft model returned no hidden states.")
        return self._eager_builder(lm_head=lm_head, vocab_size=vocab_size, tp_group=tp_group,
                                   device=device).build(hidden, root_tokens)

    def verify_mask(self, attn_backend: Any, bs: int, numel: int, device: Any) -> torch.Tensor:
        """Where this round's flat mask goes: the backend's own verify-mask buffer when it has one that fits (the
        target graph then reads it in place; no copy), else a fresh tensor. Unwritten cells are never read.
        Bases without the ``verify_mask`` attribute (0.5.14-0.5.16) keep the triton graph's flat mask buffer as
        ``cuda_graph_custom_mask`` (allocated only when graphs are captured): the same role, the same layout."""
        backend = full_attention_backend(attn_backend)
        vm = getattr(backend, "verify_mask", None)
        buf = getattr(vm, "buffer", None) if vm is not None else None
        if buf is not None and bs <= int(vm.max_bs) and buf.numel() >= numel:
            return buf[:numel]
        row = BACKENDS.get(name_of_class(type(backend).__name__))
        if not hasattr(backend, "verify_mask") and row is not None and row.graph_mask:
            flat = getattr(backend, row.graph_mask, None)
            if isinstance(flat, torch.Tensor) and flat.numel() >= numel:
                return flat[:numel]
        return torch.empty((numel,), dtype=torch.uint8, device=device)

    def finish_round(self, worker: Any, **kw: Any) -> Any:
        """The round after the draft forward (see the module docstring). With ``DDTREE_SYNC_CHECK=1`` every
        host-synchronising CUDA call made during it is logged with its source line (torch's sync debug mode)."""
        if os.environ.get("DDTREE_SYNC_CHECK") != "1" or not torch.cuda.is_available():
            return self._finish_round(worker, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return self._finish_round(worker, **kw)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                syncs = sorted({f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)})
                logger.info("DDTree sync check, round %d: %d synchronizing call site(s)%s", self.rounds, len(syncs),
                            (": " + ", ".join(syncs)) if syncs else "")

    def _finish_round(self, worker: Any, *, batch: Any, draft_input: Any, draft_out: Any, block_ids: torch.Tensor,
                      positions_2d: torch.Tensor, draft_loc_2d: torch.Tensor, lm_head: Any,
                      on_publish: Optional[Callable] = None, grammar_barrier: Optional[Callable] = None,
                      from_graph: bool = False) -> Any:
        rt = runtime()
        CaptureHiddenMode = base_name("CaptureHiddenMode")  # noqa: N806
        bs = int(block_ids.shape[0])
        n1, block = self.n1, self.block
        device = worker.device
        prefix_lens = batch.seq_lens
        model_runner = worker.model_runner
        req_to_token = model_runner.req_to_token_pool.req_to_token
        vocab = int(model_runner.model_config.vocab_size)
        tp_group = None
        if tp_size(worker) > 1:
            from sglang.srt.distributed import get_tp_group

            tp_group = get_tp_group()

        # 1) the tree
        out = self.draft_tree(draft_out=draft_out, root_tokens=block_ids[:, 0], from_graph=from_graph,
                              lm_head=lm_head, vocab_size=vocab, tp_group=tp_group, device=device)
        tree = out.tree
        positions = prefix_lens.to(torch.int64)[:, None] + tree.depth.to(torch.int64)
        grammar_tree = None
        if batch.has_grammar:  # before the verify launch: it starts an async copy of the tree
            grammar_tree = base_name("GrammarTree").from_device(out.next_token, out.next_sibling, tree.token)

        # 2) KV slots of the nodes, host bounds, mask
        verify_loc = base_name("assign_extend_cache_locs_func")(
            req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token, start_offset=prefix_lens,
            end_offset=prefix_lens + n1, batch_size=bs, draft_token_num=n1, device=device)
        planning = getattr(draft_input, "planning_seq_lens_cpu", None)  # 0.5.14: committed + a block, kept by it
        if planning is not None:
            host_prefix = planning[:bs].to(torch.int64)
        elif batch.seq_lens_cpu is not None:
            host_prefix = batch.seq_lens_cpu[:bs].to(torch.int64) + block  # committed (<= 1 round stale) + a block
        elif getattr(draft_input, "reserved_seq_lens_cpu", None) is not None:
            host_prefix = draft_input.reserved_seq_lens_cpu[:bs].to(torch.int64)
        else:  # no host bound kept by this batch: read it (one sync, only on such paths)
            host_prefix = prefix_lens.to("cpu", dtype=torch.int64)
        prefix_bound_sum = int(host_prefix.sum())
        numel = rt.mask_numel(prefix_bound_sum, bs, n1)
        mask = self.verify_mask(model_runner.attn_backend, bs, numel, device)
        rt.write_verify_mask(out.mask, prefix_lens, mask, prefix_cols=self.prefix_cols,
                             max_prefix=int(host_prefix.max()) if self.prefix_cols else None)

        verify_input = DDTreeVerifyInput(
            draft_token=tree.token.reshape(-1), positions=positions.reshape(-1), draft_token_num=n1,
            custom_mask=mask.view(torch.bool), capture_hidden_mode=CaptureHiddenMode.FULL, tree=tree,
            retrieve_next_token=out.next_token, retrieve_next_sibling=out.next_sibling)
        batch.out_cache_loc = verify_loc
        saved = (batch.seq_lens_cpu, batch.seq_lens_sum)
        batch.seq_lens_cpu = host_prefix.to(torch.int32) if saved[0] is None else host_prefix.to(saved[0].dtype)
        batch.seq_lens_sum = prefix_bound_sum
        seq_lens_pre_verify = batch.seq_lens.clone() if self.hybrid else None  # the base's tracking rule reads it
        verify_forward_batch, _ = verify_input.prepare_for_verify(batch, worker.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = saved

        # 3) verify forward
        target_out = worker.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_forward_batch, is_verify=True, skip_attn_backend_init=True)
        logits_output = target_out.logits_output
        logits = logits_output.next_token_logits
        sampling_info = batch.sampling_info
        grammar_mask = None
        if grammar_tree is not None:
            grammar_mask = base_name("build_grammar_vocab_mask")(
                reqs=batch.reqs, tree=grammar_tree, sampling_info=sampling_info, device=logits.device,
                barrier=grammar_barrier)
        if sampling_info is not None:
            base_name("apply_dflash_verify_logits_adjustments")(next_token_logits=logits,
                                                                 sampling_info=sampling_info, draft_token_num=n1)
        if grammar_mask is not None:
            grammar_mask.apply(logits)

        # 4) walk
        target = target_tokens_per_node(logits, sampling_info, bs, n1)
        self.metrics.ensure(bs, self.budget)
        caps = round_caps(getattr(batch, "reqs", None), self.budget)
        caps = caps if caps is not None and len(caps) == bs else None
        if caps is not None:  # requests that asked for less than the round: their trees cut (.request_budget)
            tree = rt.prune_tree(tree, caps_tensor(caps, device))
        walk = rt.accept_walk(tree, target)
        self.metrics.count(tree, target, walk.accepted_nodes)
        commit_lens = (walk.accept_len + 1).to(torch.int32)
        if self.adapt is not None:
            self.adapt.record(tree, target, walk.accepted_nodes, commit_lens, self.budget)
        out_tokens = walk.accepted_tokens.clamp(min=0)
        bonus = walk.bonus_token
        if self.hybrid:  # the accepted node's recurrent states (and the prefix-cache track slot's): .hybrid.commit
            worker._update_target_mamba_state_after_verify(batch=batch, seq_lens_pre_verify=seq_lens_pre_verify,
                                                           commit_lens=commit_lens,
                                                           accepted_nodes=walk.accepted_nodes)

        # 5) commit: the accepted path's slots to the front of the verify range (a permutation: nothing moves); with
        # pages (page size > 1) the positions keep their slots and the path's KV rows are copied into them instead
        slots = verify_loc.view(bs, n1)
        if self.kv_rows is not None:
            rt.move_path_kv(self.kv_rows, *rt.kv_compaction(walk, slots))
            new_slots = slots
        else:
            new_slots = rt.path_first_slot_order(walk.accepted_nodes, slots)
            cols = prefix_lens.to(torch.int64)[:, None] + torch.arange(n1, device=device, dtype=torch.int64)
            req_to_token[batch.req_pool_indices.to(torch.int64)[:, None], cols] = new_slots.to(req_to_token.dtype)
        new_seq_lens = prefix_lens + commit_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)

        # 6) the drafter's context: target hidden states of the committed nodes at positions prefix + j
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH verify requires target hidden states, but got None.")
        ctx_hidden = rt.gather_path(hidden.view(bs, n1, -1), walk.accepted_nodes, block)
        ctx_loc = new_slots[:, :block] if n1 >= block else torch.cat([new_slots, draft_loc_2d[:, n1:]], 1)
        ctx_loc = ctx_loc.contiguous()
        worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=ctx_hidden.reshape(bs * block, -1), cache_loc=ctx_loc.reshape(-1),
            cache_loc_2d=ctx_loc, positions=positions_2d.reshape(-1), commit_lens=commit_lens)
        logits_output.hidden_states = None
        self.rounds += 1

        next_draft_input = next_draft_input_decode(worker, draft_input=draft_input, bonus_tokens=bonus,
                                                   new_seq_lens=new_seq_lens)
        return self.metrics.attach(base_name("GenerationBatchResult")(
            logits_output=logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
        ), caps)
