"""`--speculative-ddtree-budget` on the spec-v2 bases: server-argument resolution (as on an H200, on CPU), the
draft/target width hook and the KV reservation, in the real patched SGLang."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from v2_helpers import TRAITS, model_dirs, run_python, with_trait

TARGET = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=512, hidden_size=64,
              intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
              torch_dtype="bfloat16", eos_token_id=0, bos_token_id=0)

SCRIPT = '''
import json, sys
from sglang.srt import server_args as S
from sglang.srt.server_args import prepare_server_args as _prepare


def prepare_server_args(argv):
    """The arguments resolved as the launcher resolves them (0.5.19+: a step of its own, resolve_once)."""
    sa = _prepare(argv)
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    return sa


def view(sa):
    try:
        from sglang.srt.arg_groups.overrides import resolved_view
    except ImportError:  # bases without the declaration overlay
        return sa
    return resolved_view(sa)
from sglang.srt.speculative.ddtree_v2.config import draft_server_args
tgt, drf = sys.argv[1], sys.argv[2]


def publish(sa):
    """Make ``sa`` the process's server arguments, as the scheduler does (0.5.14 has only the legacy global)."""
    from sglang.srt.runtime_context import get_context

    ctx = get_context()
    if hasattr(ctx, "set_server_args"):
        ctx.set_server_args(sa)
    else:
        S.set_global_server_args_for_scheduler(sa)

common = ["--model-path", tgt, "--skip-tokenizer-init", "--attention-backend", "triton", "--grammar-backend", "none",
          "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drf]
import os, tempfile
json_file = os.path.join(tempfile.mkdtemp(), "budgets.json")  # SGLang's adaptive shape, as a file
with open(json_file, "w") as fh:
    fh.write('{"1": 2, "4": 0}')
CASES = {
    "chain": [], "b15": ["--speculative-ddtree-budget", "15"], "b2": ["--speculative-ddtree-budget", "2"],
    "b64_block8": ["--speculative-ddtree-budget", "64", "--speculative-dflash-block-size", "8"],
    "zero": ["--speculative-ddtree-budget", "0"], "too_big": ["--speculative-ddtree-budget", "1024"],
    "page16": ["--speculative-ddtree-budget", "15", "--page-size", "16"],
    "page64_allowed": ["--speculative-ddtree-budget", "15", "--page-size", "64", "--speculative-ddtree-allow-unproven"],
    "flashinfer": ["--speculative-ddtree-budget", "15", "--attention-backend", "flashinfer"],
    "flashinfer_allowed": ["--speculative-ddtree-budget", "15", "--attention-backend", "flashinfer",
                           "--speculative-ddtree-allow-unproven"],
    "fa3": ["--speculative-ddtree-budget", "15", "--attention-backend", "fa3", "--speculative-ddtree-allow-unproven"],
    "num_draft_tokens": ["--speculative-ddtree-budget", "15", "--speculative-num-draft-tokens", "8"],
    "deterministic": ["--speculative-ddtree-budget", "15", "--enable-deterministic-inference"],
    "grammar": ["--speculative-ddtree-budget", "15", "--grammar-backend", "xgrammar"],
    "block64": ["--speculative-ddtree-budget", "15", "--speculative-dflash-block-size", "64"],
    "sched": ["--speculative-ddtree-budget", "1:64,8:32,16:16,32:0"],
    "sched_chain_wider": ["--speculative-ddtree-budget", "1:2,4:0"],
    "sched_json": ["--speculative-ddtree-budget", '{"1": 64, "8": 32, "16": 16, "32": 0}'],
    "sched_json_file": ["--speculative-ddtree-budget", json_file],
    "sched_no_chain": ["--speculative-ddtree-budget", "1:15,4:7"],
    "auto": ["--speculative-ddtree-budget", "auto"],
    "auto_block8": ["--speculative-ddtree-budget", "AUTO", "--speculative-dflash-block-size", "8"],
    "sched_bad_entry": ["--speculative-ddtree-budget", "1:64,8"],
    "sched_first": ["--speculative-ddtree-budget", "4:64,8:0"],
    "sched_order": ["--speculative-ddtree-budget", "1:64,16:8,8:0"],
    "word": ["--speculative-ddtree-budget", "big"],
    "sched_adapt": ["--speculative-ddtree-budget", "1:2,4:0", "--speculative-ddtree-adapt"],
    "b2_adapt": ["--speculative-ddtree-budget", "2", "--speculative-ddtree-adapt"],
    "adapt_alone": ["--speculative-ddtree-adapt"],
    # flags that would do nothing (refused with the reason; the schedule flag exists on 0.5.17 only)
    "unproven_alone": ["--speculative-ddtree-allow-unproven"],
    "unproven_idle": ["--speculative-ddtree-budget", "15", "--speculative-ddtree-allow-unproven"],
    "grammar_allowed": ["--speculative-ddtree-budget", "15", "--grammar-backend", "xgrammar",
                        "--speculative-ddtree-allow-unproven"],
    "schedule_alone": ["--speculative-ddtree-schedule", "1:15,4:0"],
    "schedule_beside_budget": ["--speculative-ddtree-budget", "15", "--speculative-ddtree-schedule", "1:15,4:0"],
    # the schedule's hysteresis (every spec-v2 base declares the flag; with one budget it holds nothing)
    "hold_b15": ["--speculative-ddtree-budget", "15", "--speculative-ddtree-schedule-hold", "3"],
    "hold_zero": ["--speculative-ddtree-budget", "15", "--speculative-ddtree-schedule-hold", "0"],
    "hold_sched": ["--speculative-ddtree-budget", "1:15,4:0", "--speculative-ddtree-schedule-hold", "16"],
    "hold_negative": ["--speculative-ddtree-budget", "15", "--speculative-ddtree-schedule-hold", "-1"],
    "hold_word": ["--speculative-ddtree-budget", "15", "--speculative-ddtree-schedule-hold", "x"],
    "hold_alone": ["--speculative-ddtree-schedule-hold", "4"],
    "hold_alone_negative": ["--speculative-ddtree-schedule-hold", "-4"],
}
import contextlib, io
out = {}
for name, extra in CASES.items():
    err = io.StringIO()  # argparse's own message (an unknown flag, a value of the wrong type) goes to stderr
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(common + extra)
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        publish(sa)
        algo = SpeculativeAlgorithm.DFLASH
        # 0.5.16 renamed the width hook (the old name stays as a deprecated alias); 0.5.14/15 have the old one only
        width = (getattr(algo, "get_num_tokens_per_req_for_target_verify", None)
                 or algo.get_num_tokens_per_bs_for_target_verify)
        v = view(sa)  # the resolved values, where readers read them (0.5.19+: the declarations, not the fields)
        n = v.speculative_num_draft_tokens
        draft = draft_server_args(sa)  # what the 0.5.14-0.5.16 workers build their draft worker from
        out[name] = {"ok": True, "num_draft_tokens": n, "block_size": v.speculative_dflash_block_size,
                     "budget": v.speculative_ddtree_budget, "topk": v.speculative_eagle_topk,
                     "schedule": getattr(v, "speculative_ddtree_schedule", None),
                     "target_width": width(n, False), "draft_width": width(n, True),
                     "copy_is_target": draft is sa, "copy_num_draft_tokens": view(draft).speculative_num_draft_tokens,
                     "copy_draft_width": width(view(draft).speculative_num_draft_tokens, True),
                     "target_after_copy": view(sa).speculative_num_draft_tokens,
                     "adapt": getattr(v, "speculative_ddtree_adapt", None),
                     "hold": getattr(v, "speculative_ddtree_schedule_hold", "absent")}
    except BaseException as e:  # an unknown flag (--speculative-ddtree-adapt before 0.5.17) exits argparse
        out[name] = {"ok": False, "type": type(e).__name__, "msg": str(e), "code": getattr(e, "code", None),
                     "stderr": err.getvalue()[-2000:]}
# EAGLE with a budget: refused before any EAGLE handling
try:
    prepare_server_args(["--model-path", tgt, "--skip-tokenizer-init", "--speculative-algorithm", "EAGLE",
                         "--speculative-draft-model-path", drf, "--speculative-ddtree-budget", "15"])
    out["eagle"] = {"ok": True}
except Exception as e:
    out["eagle"] = {"ok": False, "type": type(e).__name__, "msg": str(e)}
# resolved arguments resolved again (a ServerArgs rebuilt from its fields): the recorded schedule is kept
import dataclasses
from sglang.version import __version__ as version
try:
    sa = prepare_server_args(common + ["--speculative-ddtree-budget", "1:15,4:0" if version in sys.argv[3].split(",") else "15"])
    try:  # 0.5.20+: ServerArgs is a record composed of per-namespace structs, not a dataclass
        from sglang.srt.arg_groups.arg_utils import record_fields
    except ImportError:
        record_fields = dataclasses.fields
    again = S.ServerArgs(**{f.name: getattr(sa, f.name) for f in record_fields(type(sa)) if getattr(f, "init", True)})
    if hasattr(again, "resolve_once"):
        again.resolve_once()
    va = view(again)
    out["reresolved"] = {"ok": True, "budget": va.speculative_ddtree_budget,
                         "num_draft_tokens": va.speculative_num_draft_tokens,
                         "schedule": getattr(va, "speculative_ddtree_schedule", None)}
except Exception as e:
    out["reresolved"] = {"ok": False, "type": type(e).__name__, "msg": str(e)}
from types import SimpleNamespace
from sglang.srt.speculative.ddtree_v2.config import kv_reservation, draft_width
from sglang.srt.speculative.ddtree import schedule as SCHED
out["auto_want"] = {str(b): str(SCHED.default_schedule(range(1, 513), block_size=b)) for b in (4, 8)}
out["reserve"] = [kv_reservation(100, 16, 65), kv_reservation(100, 16, 3), kv_reservation(7, 8, 8),
                  draft_width(SimpleNamespace(speculative_ddtree_budget=None, speculative_dflash_block_size=16)),
                  draft_width(SimpleNamespace(speculative_ddtree_budget=64, speculative_dflash_block_size=16))]
print("RESULT" + json.dumps(out))
'''


def run_with_models(tree: Path, work: Path, script: str) -> dict:
    """``script`` in the patched ``tree`` (fake sm90 CUDA) with a tiny target and block-4 drafter config as its
    two arguments (the third: the bases whose series take a budget schedule); its RESULT line, parsed."""
    tgt, drf = model_dirs(work, TARGET, dict(
        TARGET, architectures=["DFlashDraftModel"], num_hidden_layers=1, layer_types=["full_attention"],
        num_target_layers=4, block_size=4, dflash_config={"block_size": 4, "target_layer_ids": [0, 2],
                                                          "mask_token": "<|mask|>", "mask_token_id": 3}))
    r = run_python(tree, work, script, str(tgt), str(drf), ",".join(with_trait("schedule")), fake_cuda=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(line[len("RESULT"):])


@pytest.fixture(scope="module")
def resolved(v2_tree: Path, tmp_path_factory) -> dict:
    return run_with_models(v2_tree, tmp_path_factory.mktemp("args"), SCRIPT)


def test_chain_unchanged(resolved):
    c = resolved["chain"]
    assert c["ok"] and c["num_draft_tokens"] == 4 and c["budget"] is None
    assert c["target_width"] == c["draft_width"] == 4
    assert c["copy_is_target"], "without DDTree the draft worker is built from the target's own arguments"


@pytest.mark.parametrize("case,budget,block", [("b15", 15, 4), ("b2", 2, 4), ("b64_block8", 64, 8)])
def test_ddtree_widths(v2_base, resolved, case, budget, block):
    c = resolved[case]
    assert c["ok"], c
    assert c["budget"] == budget and c["block_size"] == block and c["topk"] == 1
    assert c["num_draft_tokens"] == budget + 1, "the target verifies budget + 1 nodes"
    assert c["target_width"] == budget + 1, "the target verifies budget + 1 nodes"
    if TRAITS[v2_base].draft_width == "hook":
        assert c["draft_width"] == block, "the width hook gives the draft runner its block size"
    else:
        # the draft worker's own copy carries the block size; the target's arguments keep budget + 1
        assert not c["copy_is_target"] and c["copy_num_draft_tokens"] == block and c["copy_draft_width"] == block
        assert c["target_after_copy"] == budget + 1


@pytest.mark.parametrize("case,words", [
    ("zero", ["--speculative-ddtree-budget: a single budget must be >= 1", "write 1:0"]),
    ("word", ["--speculative-ddtree-budget: budget 'big' is not an integer"]),
    ("too_big", ["verify width", "1024"]),
    ("page16", ["is not proven with", "--page-size 16", "copied into its pages", "--speculative-ddtree-allow-unproven"]),
    ("flashinfer", ["not proven", "--attention-backend flashinfer", "--speculative-ddtree-allow-unproven"]),
    ("fa3", ["does not support", "fa3", "cascade"]),
    ("num_draft_tokens", ["do not pass --speculative-num-draft-tokens"]),
    ("deterministic", ["--enable-deterministic-inference"]),
    ("block64", ["block size of 64"]),
    ("eagle", ["requires --speculative-algorithm DFLASH"]),
])
def test_refusals_name_the_flag(v2_base, resolved, case, words):
    c = resolved[case]
    assert not c["ok"] and c["type"] == "ValueError", c
    if case == "flashinfer" and not TRAITS[v2_base].flashinfer:  # refused outright there, not as unproven
        words = ["does not support", "--attention-backend flashinfer on SGLang", "KV-index translator"]
    for w in words:
        assert w in c["msg"], (w, c["msg"])


def test_grammar_backend_by_base(v2_base, resolved):
    """Constrained decoding over a tree is refused as unproven where the base's DFLASH worker does it (0.5.17);
    older bases abort grammar requests in the scheduler themselves, so the flag changes nothing for DDTree."""
    c = resolved["grammar"]
    if TRAITS[v2_base].grammar:
        assert not c["ok"] and c["type"] == "ValueError", c
        assert "--grammar-backend xgrammar" in c["msg"] and "not proven" in c["msg"], c["msg"]
    else:
        assert c["ok"] and c["num_draft_tokens"] == 16, c


def test_unproven_backend_runs_when_allowed(v2_base, resolved):
    c = resolved["flashinfer_allowed"]
    if not TRAITS[v2_base].flashinfer:  # the flag does not open what is not wired on this base
        assert not c["ok"] and "KV-index translator" in c["msg"], c
        return
    assert c["ok"] and c["num_draft_tokens"] == 16, c


def test_paged_kv_runs_when_allowed(v2_base, resolved):
    """Page size > 1 is wired for triton (the accepted path's KV copied into its pages) but not proven on a GPU:
    refused by default (test_refusals_name_the_flag), resolved with the flag."""
    c = resolved["page64_allowed"]
    assert c["ok"] and c["num_draft_tokens"] == 16 and c["budget"] == 15, c


def test_kv_reservation_covers_draft_and_verify(v2_tree: Path, resolved):
    # committed + one stale round (a block) + the wider of draft block and verify width
    assert resolved["reserve"] == [181, 132, 23, None, 16]
    prep = (v2_tree / "sglang/srt/speculative/dflash_info_v2.py").read_text()
    # 0.5.19+ reserve through the base's page-aligned allocation helper, which takes the reservation itself
    assert "committed_len + reserve_ahead" in prep or ("reserve = kv_reservation(" in prep and "reserve=reserve" in prep)


SCHEDULES = {  # case: (canonical schedule, largest budget, widest verify with the draft config's block of 4)
    "sched": ("1:64,8:32,16:16,32:0", 64, 65),
    "sched_chain_wider": ("1:2,4:0", 2, 4),  # the chain's block (4) is wider than the b2 tree (3)
    "sched_no_chain": ("1:15,4:7", 15, 16),
    "sched_json": ("1:64,8:32,16:16,32:0", 64, 65),  # SGLang's adaptive shape, inline
    "sched_json_file": ("1:2,4:0", 2, 4),  # and from a .json file
}


@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_schedule_resolution(v2_base, resolved, case):
    """0.5.17: the schedule resolves to its canonical text, the budget to its largest entry (what sizes the tree
    buffers) and the target's width to the widest verify; the drafter keeps its block. Older bases refuse a
    schedule naming themselves."""
    c = resolved[case]
    if not TRAITS[v2_base].schedule:
        assert not c["ok"] and c["type"] == "ValueError", c
        assert f"this is SGLang {v2_base}: give one budget N" in c["msg"] and "--speculative-ddtree-budget" in c["msg"]
        return
    text, budget, width = SCHEDULES[case]
    assert c["ok"], c
    assert c["schedule"] == text and c["budget"] == budget and c["block_size"] == 4
    assert c["num_draft_tokens"] == width and c["target_width"] == width and c["draft_width"] == 4


@pytest.mark.parametrize("case,block", [("auto", 4), ("auto_block8", 8)])
def test_auto_is_the_cost_model_schedule(v2_base, resolved, case, block):
    c = resolved[case]
    if not TRAITS[v2_base].schedule:
        assert not c["ok"] and f"this is SGLang {v2_base}" in c["msg"] and "auto" in c["msg"], c
        return
    assert c["ok"], c
    want = resolved["auto_want"][str(block)]
    assert c["schedule"] == want and c["block_size"] == block
    assert c["budget"] == max(int(e.split(":")[1]) for e in want.split(","))


@pytest.mark.parametrize("case,words", [
    ("sched_bad_entry", ["--speculative-ddtree-budget: entry 2 '8' is not THRESHOLD:BUDGET"]),
    ("sched_first", ["--speculative-ddtree-budget: the first threshold must be 1"]),
    ("sched_order", ["--speculative-ddtree-budget: batch-size thresholds must increase strictly, got 8 after 16"]),
])
def test_bad_schedules_name_the_flag(v2_base, resolved, case, words):
    c = resolved[case]
    assert not c["ok"] and c["type"] == "ValueError", c
    if not TRAITS[v2_base].schedule:  # refused before parsing: the base cannot run any schedule
        assert f"this is SGLang {v2_base}" in c["msg"], c["msg"]
        return
    for w in words:
        assert w in c["msg"], (w, c["msg"])


def test_adaptation_flag(v2_base, resolved):
    """0.5.17: --speculative-ddtree-adapt sizes the target for the chain's block too (a tree size may drop to the
    chain); it needs a budget. Older bases have no such flag."""
    if not TRAITS[v2_base].schedule:
        assert not resolved["sched_adapt"]["ok"] and resolved["sched_adapt"]["type"] == "SystemExit"
        return
    a, b = resolved["sched_adapt"], resolved["b2_adapt"]
    assert a["ok"] and a["adapt"] and a["schedule"] == "1:2,4:0" and a["num_draft_tokens"] == 4, a
    assert b["ok"] and b["budget"] == 2 and b["num_draft_tokens"] == 4, b  # block 4 > the b2 tree's 3
    assert resolved["b2"]["num_draft_tokens"] == 3  # without adaptation: the tree's width
    c = resolved["adapt_alone"]
    assert not c["ok"] and "--speculative-ddtree-adapt needs --speculative-ddtree-budget" in c["msg"], c


@pytest.mark.parametrize("case,words", [
    ("unproven_alone", ["--speculative-ddtree-allow-unproven does nothing without --speculative-ddtree-budget"]),
    ("unproven_idle", ["--speculative-ddtree-allow-unproven does nothing here", "gates only",
                       "--attention-backend flashinfer"]),
])
def test_flags_that_do_nothing_are_refused(v2_base, resolved, case, words):
    """--speculative-ddtree-allow-unproven alone, or where nothing it gates is in use (triton, TP 1, no grammar,
    no draft window), is refused at argument resolution with the reason; it stays the gate of what it gates."""
    c = resolved[case]
    assert not c["ok"] and c["type"] == "ValueError", c
    for w in words:
        assert w in c["msg"], (w, c["msg"])
    if TRAITS[v2_base].flashinfer:
        assert resolved["flashinfer_allowed"]["ok"], "the flag still lets a wired-but-unproven backend run"
    else:  # FlashInfer is not wired on this base; the flag still gates the rest (grammar, TP, draft window)
        assert resolved["grammar_allowed"]["ok"] == TRAITS[v2_base].grammar


def test_allow_unproven_with_a_grammar_backend_by_base(v2_base, resolved):
    """A grammar backend is unproven only where the base's DFLASH worker does constrained decoding (0.5.17): there
    the flag gates it; on the older bases it gates nothing and is refused."""
    c = resolved["grammar_allowed"]
    if TRAITS[v2_base].grammar:
        assert c["ok"] and c["num_draft_tokens"] == 16, c
    else:
        assert not c["ok"] and "does nothing here" in c["msg"], c


def test_schedule_hold_flag(v2_base, resolved):
    """--speculative-ddtree-schedule-hold on every spec-v2 base: resolution records the hold a DDTree server runs
    (default 8, shown by /get_server_info), beside a single budget too (where it holds nothing: a budget tune fits
    may be single, and the launch line keeps the flag); a bad value is refused naming the flag (argparse exits 2 for
    a non-integer), and so is the flag without a budget."""
    assert resolved["b15"]["hold"] == 8 and resolved["chain"]["hold"] is None, (resolved["b15"], resolved["chain"])
    assert resolved["hold_b15"]["ok"] and resolved["hold_b15"]["hold"] == 3, resolved["hold_b15"]
    assert resolved["hold_zero"]["ok"] and resolved["hold_zero"]["hold"] == 0, resolved["hold_zero"]
    c = resolved["hold_sched"]
    if TRAITS[v2_base].schedule:
        assert c["ok"] and c["hold"] == 16 and c["schedule"] == "1:15,4:0", c
        assert resolved["sched"]["hold"] == 8
    else:
        assert not c["ok"] and f"this is SGLang {v2_base}: give one budget N" in c["msg"], c
    c = resolved["hold_negative"]
    assert not c["ok"] and c["type"] == "ValueError", c
    assert "--speculative-ddtree-schedule-hold: must be >= 0 decode rounds (0 or 1 = no hold), got -1" in c["msg"]
    c = resolved["hold_word"]
    assert not c["ok"] and c["type"] == "SystemExit" and c["code"] == 2, c
    assert "--speculative-ddtree-schedule-hold" in c["stderr"] and "'x'" in c["stderr"], c["stderr"]
    c = resolved["hold_alone"]
    assert not c["ok"] and c["type"] == "ValueError", c
    assert "--speculative-ddtree-schedule-hold 4 does nothing without --speculative-ddtree-budget" in c["msg"], c
    c = resolved["hold_alone_negative"]  # the bad value is named as such before the missing budget
    assert not c["ok"] and "--speculative-ddtree-schedule-hold: must be >= 0 decode rounds" in c["msg"], c


def test_schedule_flag_that_does_nothing(v2_base, resolved):
    """0.5.17's internal --speculative-ddtree-schedule (it records the resolved schedule) is refused without a
    budget and beside a command-line budget (resolution would replace it), naming the budget flag to use; older
    bases do not have it (argparse refuses it). Resolved arguments resolved again keep their schedule."""
    alone, beside, again = resolved["schedule_alone"], resolved["schedule_beside_budget"], resolved["reresolved"]
    if not TRAITS[v2_base].schedule:
        assert alone["type"] == beside["type"] == "SystemExit", (alone, beside)
        assert again["ok"] and again["budget"] == 15 and again["num_draft_tokens"] == 16, again
        return
    assert not alone["ok"] and alone["type"] == "ValueError", alone
    assert "--speculative-ddtree-schedule 1:15,4:0 does nothing without --speculative-ddtree-budget" in alone["msg"]
    assert "--speculative-ddtree-budget 1:15,4:0" in alone["msg"]
    assert not beside["ok"] and "beside --speculative-ddtree-budget 15 does nothing" in beside["msg"], beside
    assert again["ok"] and again["schedule"] == "1:15,4:0" and again["budget"] == 15, again
    assert again["num_draft_tokens"] == 16, again
