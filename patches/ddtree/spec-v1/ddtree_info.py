"""DDTree's verify input for the spec-v1 DFlash worker of SGLang 0.5.11, and the round step that builds it.

`DDTreeVerifyInput` is a `DFlashVerifyInput` (same spec-input type, so every DFLASH code path treats it as a DFLASH
verify of width budget + 1) that verifies a draft tree instead of the chain; `prepare_ddtree_verify` is the worker's
step after the draft forward (draft top-k, tree, verify input). SGLang's own `dflash_info.py` holds DFLASH's inputs;
this module sits beside it and is vendored whole by the 0.5.11 patch set (patches/ddtree/spec-v1/), whose patch 0002
makes `DFlashWorker` call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch

from sglang.srt.distributed import get_tp_group
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.mem_cache.common import alloc_token_slots
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.ddtree_verify import (
    accepted_kv_and_hidden_index,
    build_ddtree_verify_mask,
    ddtree_draft_topk,
    ddtree_runtime,
    sample_target_tokens_per_node,
)
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.spec_utils import assign_req_to_token_pool_func


def _map_slots(batch: ScheduleBatch, end_offset: torch.Tensor, bs: int) -> None:
    """Point req_to_token[seq_len : end_offset] of each request at batch.out_cache_loc, in order."""
    assign_req_to_token_pool_func(
        batch.req_pool_indices,
        batch.req_to_token_pool.req_to_token,
        batch.seq_lens,
        end_offset,
        batch.out_cache_loc,
        bs,
    )


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """Target verify of a DDTree draft tree (DFLASH + --speculative-ddtree-budget).

    `draft_token` / `positions` hold the tree's N1 = budget + 1 nodes per request
    (node 0 = root, parents before children) at depth positions
    (committed length + depth). `custom_mask` is the tree mask in the triton
    backend's flattened [N1, prefix + N1] per-request layout. It stays a
    `DFlashVerifyInput` (same spec-input type), so every DFLASH code path
    (graph runners, backends, scheduler checks) treats it as a DFLASH verify of
    width N1.
    """

    tree: object = None  # runtime DraftTree
    tree_mask: torch.Tensor | None = None  # bool [bs, N1, N1]
    # Hybrid (GatedDeltaNet) targets: the tree as first child / next sibling per node
    # (int32 [bs, N1], -1 = none), read by the linear-attention backend's tree kernels.
    retrieve_next_token: torch.Tensor | None = None
    retrieve_next_sibling: torch.Tensor | None = None
    # Set by verify(): int32 [bs, L+1], root first then the accepted path (-1 padding);
    # the hybrid state commit maps path steps to node indices through it.
    accepted_nodes: torch.Tensor | None = None

    def prepare_for_verify(
        self,
        batch: ScheduleBatch,
        page_size: int,
        *,
        build_custom_mask: bool = True,
    ):
        if batch.forward_mode.is_idle():
            return
        if page_size != 1:
            raise RuntimeError(
                f"DDTree verify requires page_size == 1, got page_size={page_size}."
            )
        batch.input_ids = self.draft_token
        batch.out_cache_loc = alloc_token_slots(batch.tree_cache, len(batch.input_ids))
        end_offset = batch.seq_lens + self.draft_token_num
        bs = batch.batch_size()
        _map_slots(batch, end_offset, bs)
        seq_lens_cpu = batch.seq_lens_cpu[:bs]
        self.custom_mask = build_ddtree_verify_mask(
            self.tree_mask,
            batch.seq_lens,
            int(seq_lens_cpu.sum()),
            int(seq_lens_cpu.max()) if bs > 0 else 0,
        )

    def verify(
        self,
        *,
        batch: ScheduleBatch,
        logits_output: LogitsProcessorOutput,
        page_size: int,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]:
        """Tree walk, stop tokens, KV keep/free for the accepted path, drafter context."""
        if batch.forward_mode.is_idle():
            empty = torch.empty((0,), dtype=torch.int64, device=batch.device)
            return empty, empty.to(torch.int32), empty, []

        bs = batch.batch_size()
        n1 = int(self.draft_token_num)
        logits = logits_output.next_token_logits
        device = logits.device

        sampling_info = batch.sampling_info
        if sampling_info is not None:
            if len(sampling_info) != bs:
                raise RuntimeError(
                    "DDTree verify sampling_info size mismatch: "
                    f"len(sampling_info)={len(sampling_info)}, bs={bs}."
                )
            if sampling_info.has_custom_logit_processor:
                apply_custom_logit_processor(
                    logits, sampling_info, num_tokens_in_batch=n1
                )
            if (
                sampling_info.penalizer_orchestrator.is_required
                or sampling_info.logit_bias is not None
            ):
                linear_penalty = torch.zeros(
                    (bs, logits.shape[1]), dtype=torch.float32, device=device
                )
                sampling_info.apply_logits_bias(linear_penalty)
                logits.add_(torch.repeat_interleave(linear_penalty, n1, dim=0))

        target_tokens = sample_target_tokens_per_node(logits, sampling_info, bs, n1)
        walk = ddtree_runtime().accept_walk(self.tree, target_tokens)
        self.accepted_nodes = walk.accepted_nodes

        # Single D2H transfer: committed tokens (accepted drafts + bonus) and accept_len.
        packed = torch.cat(
            [
                walk.accepted_tokens.to(torch.int64),
                walk.accept_len.to(torch.int64).unsqueeze(1),
            ],
            dim=1,
        ).cpu()
        lp1 = int(walk.accepted_tokens.shape[1])

        num_accepted_drafts_per_req_cpu: List[int] = []
        commit_lens_cpu: List[int] = []
        new_verified_list: List[int] = []
        for i, req in enumerate(batch.reqs):
            acc_len = int(packed[i, lp1])
            proposed = packed[i, : acc_len + 1].tolist()
            appended = 0
            for token_id in proposed:
                token_id = int(token_id)
                req.output_ids.append(token_id)
                appended += 1
                req.check_finished()
                if req.finished():
                    break
                if req.grammar is not None:
                    req.grammar.accept_token(token_id)
            if req.output_ids:
                new_verified_token = int(req.output_ids[-1])
            elif req.origin_input_ids:
                new_verified_token = int(req.origin_input_ids[-1])
            else:
                raise RuntimeError(
                    "DDTree verify cannot determine current token: both output_ids and origin_input_ids are empty."
                )
            commit_lens_cpu.append(appended)
            new_verified_list.append(new_verified_token)
            num_accepted_drafts_per_req_cpu.append(max(0, appended - 1))
            req.spec_verify_ct += 1
            req.spec_accepted_drafts += num_accepted_drafts_per_req_cpu[-1]

        commit_lens = torch.tensor(commit_lens_cpu, dtype=torch.int32, device=device)
        new_verified_id = torch.tensor(
            new_verified_list, dtype=torch.int64, device=device
        )

        # KV: the verify wrote KV for every node at batch.out_cache_loc[b * n1 + node].
        # Keep the committed path's slots (root first, path order), free all others, and
        # point req_to_token[seq_len : seq_len + commit] at the kept slots. The committed
        # out_cache_loc is re-indexed to the accepted nodes' slots (not the first slots).
        keep_flat, keep_node_mask, _ = accepted_kv_and_hidden_index(
            walk.accepted_nodes, commit_lens, n1
        )
        out_cache_loc = batch.out_cache_loc.view(bs, n1)
        batch.token_to_kv_pool_allocator.free(out_cache_loc[~keep_node_mask])
        batch.out_cache_loc = batch.out_cache_loc.view(-1)[keep_flat]

        for req, commit_len in zip(batch.reqs, commit_lens_cpu, strict=True):
            req.kv_committed_len += commit_len
            req.kv_allocated_len = req.kv_committed_len

        end_offset = batch.seq_lens + commit_lens.to(batch.seq_lens.dtype)
        _map_slots(batch, end_offset, bs)
        batch.seq_lens.add_(commit_lens.to(batch.seq_lens.dtype))
        batch.seq_lens_cpu.add_(
            torch.tensor(commit_lens_cpu, dtype=batch.seq_lens_cpu.dtype)
        )
        batch.seq_lens_sum += sum(commit_lens_cpu)

        # Drafter context: the target hidden states of the committed nodes, in path order.
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError(
                "DDTree verify requires target hidden states, but got None."
            )
        hidden = hidden.view(bs * n1, -1)
        next_target_hidden = hidden.index_select(0, keep_flat)
        logits_output.hidden_states = None

        return (
            new_verified_id,
            commit_lens,
            next_target_hidden,
            num_accepted_drafts_per_req_cpu,
        )


def prepare_ddtree_verify(
    worker,
    *,
    batch: ScheduleBatch,
    draft_hidden: torch.Tensor,
    lm_head,
    root_tokens: torch.Tensor,
) -> None:
    """Draft top-k -> tree -> tree-masked verify input (all on the device).

    `worker` is the DFlashWorker (its block size, DDTree budget, top-k, verify width and page size).
    """
    rt = ddtree_runtime()
    bs = int(draft_hidden.shape[0])
    depth = worker.block_size - 1
    hidden = draft_hidden[:, 1:, :].reshape(-1, draft_hidden.shape[-1])
    tp_group = get_tp_group()
    lp, tok = ddtree_draft_topk(
        hidden,
        lm_head,
        int(worker.ddtree_topk),
        tp_group=tp_group if int(tp_group.world_size) > 1 else None,
    )
    tree = rt.build_tree(
        lp.view(bs, depth, -1),
        tok.view(bs, depth, -1),
        root_tokens.to(torch.int64),
        int(worker.ddtree_budget),
    )
    vin = rt.build_verify_inputs(tree, batch.seq_lens.to(torch.int64))
    # Unused slots (only when the vocab is smaller than the budget) carry token -1 in
    # some layouts; they are masked to themselves and never walked, so any valid id works.
    draft_token = tree.token.clamp(min=0).reshape(-1)
    verify_input = DDTreeVerifyInput(
        draft_token=draft_token,
        positions=vin.positions.reshape(-1),
        draft_token_num=int(worker.ddtree_verify_width),
        custom_mask=None,
        tree=tree,
        tree_mask=vin.mask,
        # First child / next sibling per node: what the hybrid backend's tree-aware
        # conv1d and GatedDeltaNet kernels read (parents precede children).
        retrieve_next_token=vin.retrive_next_token.to(torch.int32),
        retrieve_next_sibling=vin.retrive_next_sibling.to(torch.int32),
    )
    verify_input.prepare_for_verify(batch, worker.page_size, build_custom_mask=True)
    batch.forward_mode = (
        ForwardMode.TARGET_VERIFY
        if not batch.forward_mode.is_idle()
        else ForwardMode.IDLE
    )
    batch.spec_info = verify_input
    batch.return_hidden_states = False
