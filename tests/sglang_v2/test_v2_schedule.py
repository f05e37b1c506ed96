"""A DDTree budget schedule on SGLang 0.5.17, against the real patched classes on CPU: the target graph runner's
width per captured batch size (what it captures and replays, with the tree mask only at tree sizes), the round's
budget from the padded batch size, and the draft graph's tail per size (the base's own greedy head at budget 0,
so a chain round is the stock chain's)."""
from __future__ import annotations

import pytest
from test_v2_server_args import run_with_models

SCRIPT = r'''
import json, sys
from types import SimpleNamespace
import torch
from sglang.srt import server_args as S
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context, get_spec
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler
from sglang.srt.speculative.ddtree_v2.graph_widths import runner_widths, select_for_batch
from sglang.srt.speculative.ddtree_v2.round import DDTreeRound
from sglang.srt.speculative.ddtree_v2.draft_schedule import ScheduledDraftHead
from sglang.srt.speculative.ddtree_v2.draft_topk import DraftTreeBuilder
tgt, drf = sys.argv[1], sys.argv[2]
common = ["--model-path", tgt, "--skip-tokenizer-init", "--attention-backend", "triton", "--grammar-backend", "none",
          "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drf]
CAPTURE = [1, 2, 4, 8, 12, 16, 24, 32]
TritonAttnBackend = type("TritonAttnBackend", (), {})  # the mask policy reads the class name only
MASK_BUF = torch.zeros(8, dtype=torch.bool)


def runner_for(sa, is_draft=False):
    """A bare DecodeCudaGraphRunner with what its width paths read (its GPU __init__ is not run)."""
    get_context().set_server_args(sa)
    r = object.__new__(DecodeCudaGraphRunner)
    r.captured_req_width = sa.speculative_num_draft_tokens  # what __init__ assigns (through the setter)
    mr = SimpleNamespace(is_draft_worker=is_draft, spec_algorithm=SpeculativeAlgorithm.DFLASH,
                         attn_backend=TritonAttnBackend())
    r.model_runner = mr
    r._ddtree_widths = runner_widths(mr, get_spec()) if sa.speculative_ddtree_budget is not None else None
    r.capture_bs = CAPTURE
    r.buffers = SimpleNamespace(custom_mask=MASK_BUF)
    r.ragged_verify_mode = False
    return r


def spec_at(r, bs):
    """What the runner captures at size bs: its width and the capture spec info."""
    if r._ddtree_widths is not None:
        r._ddtree_widths.select(bs)
    width = r.captured_req_width
    info = r.get_spec_info(bs * width)
    return {"width": width, "draft_token_num": info.draft_token_num, "mask": info.custom_mask is MASK_BUF,
            "hidden": int(info.capture_hidden_mode)}


out = {}
sched = prepare_server_args(common + ["--speculative-ddtree-budget", "1:64,8:32,16:16,32:0"])
single = prepare_server_args(common + ["--speculative-ddtree-budget", "15"])
chain = prepare_server_args(common)

r = runner_for(sched)
out["unselected_width"] = r.captured_req_width
out["capture"] = {bs: spec_at(r, bs) for bs in CAPTURE}
from sglang.srt.speculative.ddtree_v2.verify_input import DDTreeVerifyInput
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
TREE_IN = object.__new__(DDTreeVerifyInput)
CHAIN_IN = object.__new__(DFlashVerifyInput)
replay = {}
for raw in (1, 3, 5, 8, 9, 13, 17, 25, 32, 40):
    spec = TREE_IN if raw < 25 else CHAIN_IN  # what the round sends at that size
    select_for_batch(r, SimpleNamespace(batch_size=raw, spec_info=spec))
    replay[raw] = [r._ddtree_widths.bs, r.captured_req_width, r._make_graph_key(r._ddtree_widths.bs).variant_label]
out["replay"] = replay
select_for_batch(r, SimpleNamespace(batch_size=3, spec_info=CHAIN_IN))  # no chain graph at 4 without adaptation
out["chain_at_tree_size"] = [r.captured_req_width, r._make_graph_key(4).variant_label]

# adaptation: tree sizes are captured a second time as the chain, under their own graph key
adapt = prepare_server_args(common + ["--speculative-ddtree-budget", "1:64,8:32,16:16,32:0",
                                      "--speculative-ddtree-adapt"])
ra = runner_for(adapt)
out["adapt_kinds"] = {bs: list(ra._ddtree_widths.kinds(bs)) for bs in CAPTURE}
caps = {}
for bs in (1, 16, 32):
    for kind in ra._ddtree_widths.kinds(bs):
        ra._ddtree_widths.select(bs, kind)
        info = ra.get_spec_info(bs * ra.captured_req_width)
        caps[f"{bs}-{kind}"] = {"width": ra.captured_req_width, "draft_token_num": info.draft_token_num,
                                "mask": info.custom_mask is MASK_BUF, "hidden": int(info.capture_hidden_mode),
                                "label": ra._make_graph_key(bs, None, "lora").variant_label}
out["adapt_capture"] = caps
select_for_batch(ra, SimpleNamespace(batch_size=3, spec_info=CHAIN_IN))
out["adapt_replay_chain"] = [ra._ddtree_widths.bs, ra.captured_req_width, ra._make_graph_key(4).variant_label]
ra._ddtree_widths.select(None)
out["adapt_unselected"] = ra.captured_req_width
r1 = runner_for(single)
out["single"] = {"widths": r1._ddtree_widths is None, "capture": {bs: spec_at(r1, bs) for bs in (1, 32)}}
rc = runner_for(chain)
out["stock_chain"] = {bs: spec_at(rc, bs) for bs in (16, 32)}
out["draft_runner"] = runner_for(sched, is_draft=True)._ddtree_widths is None

# the round: budget from the padded size; the draft's and the target's capture lists must agree
get_context().set_server_args(sched)
rnd = DDTreeRound.for_worker(sched, block_size=4)
def worker(target_bs, draft_bs):
    mk = lambda sizes: SimpleNamespace(decode_cuda_graph_runner=SimpleNamespace(capture_bs=sizes) if sizes else None)
    return SimpleNamespace(model_runner=mk(target_bs), draft_model_runner=mk(draft_bs))
w = worker(CAPTURE, CAPTURE)
out["round"] = {raw: [rnd.tree_round(w, raw), rnd.budget, rnd.n1] for raw in (1, 7, 8, 9, 15, 16, 17, 25, 33)}
SCHED = ["--speculative-ddtree-budget", "1:64,8:32,16:16,32:0"]
nohold = prepare_server_args(common + SCHED + ["--speculative-ddtree-schedule-hold", "0"])
eager = DDTreeRound.for_worker(nohold, block_size=4)
out["round_eager"] = {raw: [eager.tree_round(worker(None, None), raw), eager.budget] for raw in (7, 9, 31, 33)}
# the hysteresis (--speculative-ddtree-schedule-hold 3): a change of budget waits 3 decode rounds where the round
# can run the held budget (eagerly: any of the schedule's); at a captured size only what was captured there runs
held = prepare_server_args(common + SCHED + ["--speculative-ddtree-schedule-hold", "3"])
SEQ = [1, 1, 9, 1, 9, 9, 9, 9, 33, 33, 33]
h_eager, h_graph = DDTreeRound.for_worker(held, block_size=4), DDTreeRound.for_worker(held, block_size=4)
out["hold_eager"] = [[h_eager.tree_round(worker(None, None), raw), h_eager.budget] for raw in SEQ]
out["hold_graph"] = [[h_graph.tree_round(w, raw), h_graph.budget] for raw in SEQ]
out["hold_counts"] = {k: [r.hysteresis.switches, r.hysteresis.forced, r.hysteresis.held]
                      for k, r in (("eager", h_eager), ("graph", h_graph))}
out["hold"] = {"default": rnd.hysteresis.hold, "held": h_eager.hysteresis.hold, "none": eager.hysteresis.hold,
               "resolved": [getattr(sched, "speculative_ddtree_schedule_hold", None),
                            getattr(held, "speculative_ddtree_schedule_hold", None)]}
ad = DDTreeRound.for_worker(adapt, block_size=4)
out["runnable"] = {"sched": [sorted(rnd.runnable(p, CAPTURE)) for p in (4, 32, 40)],
                   "adapt": [sorted(ad.runnable(p, CAPTURE)) for p in (4, 32, 40)],
                   "eager": sorted(rnd.runnable(4, []))}
bad = DDTreeRound.for_worker(sched, block_size=4)
w_bad = worker(CAPTURE, [1, 2, 4, 8, 16, 32])  # the draft's sizes decide (its tail built the tree)
out["mismatch"] = {raw: [bad.tree_round(w_bad, raw), bad.budget] for raw in (7, 12, 20)}
out["counts"] = [rnd.rounds, rnd.chain_rounds]

# the draft graph's tail per captured size: the base's own greedy head at budget 0, the tree builders elsewhere
g = torch.Generator().manual_seed(7)
V, H, block = 48, 16, 4
lm_head = SimpleNamespace(weight=torch.randn(V, H, generator=g))
head = rnd.draft_builder(lm_head=lm_head, vocab_size=V, max_bs=32, tp_group=SimpleNamespace(world_size=1),
                         device="cpu", chain_head_cls=_DflashDraftSampler)
out["head"] = {"type": type(head).__name__, "trees": sorted(head.trees), "chain": type(head.chain).__name__}
stock = _DflashDraftSampler(weight=lm_head.weight, block_size=block, num_org=V, org_vocab_start=0, max_bs=32)
res = {}
for bs in (32, 24, 8, 1):
    hidden = torch.randn(bs * block, H, generator=g)
    ids = torch.randint(0, V, (bs * block,), generator=g)
    head(hidden, ids)  # the capture-hook body at this captured size
    budget = sched_budget = int(rnd.schedule.budget_for(bs))
    if budget == 0:
        stock(hidden, ids)
        n = bs * (block - 1)
        res[bs] = {"budget": 0, "chain_equal": bool(torch.equal(head.out[:n], stock.out[:n]))}
    else:
        ref = DraftTreeBuilder(lm_head=lm_head, block_size=block, budget=budget, vocab_size=V, max_bs=0,
                               device="cpu").build(hidden, ids.view(bs, block)[:, 0])
        got = head.read(budget, bs)
        res[bs] = {"budget": budget, "n1": int(got.tree.token.shape[1]),
                   "tree_equal": all(bool(torch.equal(getattr(got.tree, f), getattr(ref.tree, f)))
                                     for f in ("token", "parent", "depth", "num_nodes")),
                   "mask_equal": bool(torch.equal(got.mask, ref.mask))}
out["tail"] = res
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def sched(v2_trees, tmp_path_factory) -> dict:
    return run_with_models(v2_trees("0.5.17"), tmp_path_factory.mktemp("sched"), SCRIPT)


BUDGET = {1: 64, 2: 64, 4: 64, 8: 32, 12: 32, 16: 16, 24: 16, 32: 0}


def test_target_graph_width_per_captured_size(sched):
    """Each captured size gets budget(bs) + 1 (the block at budget 0), captured with the tree-mask buffer only at
    tree sizes; before a size is selected the runner reports the widest verify (its buffers are sized by it)."""
    assert sched["unselected_width"] == 65
    for bs, budget in BUDGET.items():
        cap = sched["capture"][str(bs)]
        width = budget + 1 if budget else 4
        assert cap["width"] == cap["draft_token_num"] == width, (bs, cap)
        assert cap["mask"] == (budget > 0), (bs, cap)


def test_chain_size_captures_the_stock_chain_verify(sched):
    """At a budget-0 size the target's graph is captured exactly as the stock chain's (DDTree off)."""
    assert sched["capture"]["32"] == sched["stock_chain"]["32"]
    assert sched["stock_chain"]["32"]["width"] == 4 and not sched["stock_chain"]["32"]["mask"]


def test_replay_width_from_the_padded_size(sched):
    """A batch replays at the smallest captured size >= its own, with that size's width; past the largest size
    (eager) its own size decides."""
    want = {1: [1, 65], 3: [4, 65], 5: [8, 33], 8: [8, 33], 9: [12, 33], 13: [16, 17], 17: [24, 17], 25: [32, 4],
            32: [32, 4], 40: [40, 4]}
    assert {int(k): v[:2] for k, v in sched["replay"].items()} == want
    assert all(v[2] is None for v in sched["replay"].values()), "each size's own graph: the base's key"
    # a chain verify at a tree size without adaptation finds the tree's width (65 != 4): it runs eagerly
    assert sched["chain_at_tree_size"] == [65, None]


def test_adaptation_captures_the_chain_beside_each_tree(sched):
    """With --speculative-ddtree-adapt every tree size also has a chain graph (the block's width, no tree mask,
    the stock chain's capture) under a key of its own; chain sizes keep their one graph."""
    kinds = {int(k): v for k, v in sched["adapt_kinds"].items()}
    assert kinds == {bs: (["tree", "chain"] if b else ["chain"]) for bs, b in BUDGET.items()}
    caps = sched["adapt_capture"]
    assert caps["1-tree"]["width"] == 65 and caps["1-tree"]["mask"] and caps["1-tree"]["label"] == "lora"
    assert caps["16-tree"]["width"] == 17 and caps["16-tree"]["mask"]
    stock = {k: sched["stock_chain"]["32"][k] for k in ("width", "draft_token_num", "mask", "hidden")}
    for key in ("1-chain", "16-chain"):
        assert {k: caps[key][k] for k in stock} == stock, key
        assert caps[key]["label"] == "lora+ddtree-chain"
    assert caps["32-chain"]["label"] == "lora"  # the chain is the primary graph there
    assert sched["adapt_replay_chain"] == [4, 4, "ddtree-chain"]
    assert sched["adapt_unselected"] == 65


def test_single_budget_keeps_one_width(sched):
    """One N: no per-size widths at all (the proven single-budget path), the draft runner never has any."""
    single = sched["single"]
    assert single["widths"] and sched["draft_runner"]
    assert single["capture"]["1"]["width"] == single["capture"]["32"]["width"] == 16
    assert single["capture"]["1"]["mask"] and single["capture"]["32"]["mask"]


def test_round_budget_from_the_padded_size(sched):
    got = {int(k): v for k, v in sched["round"].items()}
    assert got == {1: [True, 64, 65], 7: [True, 32, 33], 8: [True, 32, 33], 9: [True, 32, 33],
                   15: [True, 16, 17], 16: [True, 16, 17], 17: [True, 16, 17], 25: [False, 0, 1],
                   33: [False, 0, 1]}
    assert sched["counts"] == [0, 2]  # two chain rounds picked (finish_round counts the tree rounds it runs)
    eager = {int(k): v for k, v in sched["round_eager"].items()}
    assert eager == {7: [True, 64], 9: [True, 32], 31: [True, 16], 33: [False, 0]}  # no graphs: the raw size
    # differing capture lists: the draft's sizes decide (7 -> 8: b32; 12 -> 16: b16; 20 -> 32: the chain)
    assert {int(k): v for k, v in sched["mismatch"].items()} == {7: [True, 32], 12: [True, 16], 20: [False, 0]}


def test_round_budget_through_the_hysteresis(sched):
    """--speculative-ddtree-schedule-hold 3: eagerly (no graphs, every budget of the schedule can run) a change waits
    until the decode batch has wanted the new budget 3 rounds in a row (a round wanting the running one resets it);
    at a captured size only the budget captured there can run, so a held one gives way at once (forced), and past
    the largest captured size (eager) the hold applies again. The default hold is 8 and resolution records it."""
    # wanted: 64 64 32 64 32 32 32 32 0 0 0 (batch sizes 1 1 9 1 9 9 9 9 33 33 33)
    assert sched["hold_eager"] == [[True, 64]] * 6 + [[True, 32]] * 4 + [[False, 0]]
    assert sched["hold_graph"] == ([[True, 64]] * 2 + [[True, 32], [True, 64]] + [[True, 32]] * 6
                                   + [[False, 0]])
    assert sched["hold_counts"] == {"eager": [2, 0, 5], "graph": [4, 3, 2]}  # [switches, forced, held rounds]
    assert sched["hold"] == {"default": 8, "held": 3, "none": 0, "resolved": [8, 3]}
    # what a round can run: its captured size's budget (and the chain's, with adaptation); eagerly every budget
    assert sched["runnable"] == {"sched": [[64], [0], [0, 16, 32, 64]], "adapt": [[0, 64], [0], [0, 16, 32, 64]],
                                 "eager": [0, 16, 32, 64]}


def test_draft_graph_tail_per_size(sched):
    """The draft tail at a chain size is the base's own greedy head (its tokens equal a stock sampler's on the
    same hidden states: the chain round reads them as the stock worker does); at tree sizes the tree equals the
    eager build of that size's budget."""
    assert sched["head"] == {"type": "ScheduledDraftHead", "trees": [16, 32, 64], "chain": "_DflashDraftSampler"}
    tail = {int(k): v for k, v in sched["tail"].items()}
    assert tail[32] == {"budget": 0, "chain_equal": True}
    for bs, budget in ((24, 16), (8, 32), (1, 64)):
        assert tail[bs] == {"budget": budget, "n1": budget + 1, "tree_equal": True, "mask_equal": True}, bs
