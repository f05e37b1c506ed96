"""`--speculative-ddtree-budget` on the spec-v2 bases: server-argument resolution (as on an H200, on CPU), the
draft/target width hook and the KV reservation, in the real patched SGLang."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from v2_helpers import TRAITS, model_dirs, run_python

TARGET = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=512, hidden_size=64,
              intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
              torch_dtype="bfloat16", eos_token_id=0, bos_token_id=0)

SCRIPT = '''
import json, sys
from sglang.srt import server_args as S
from sglang.srt.server_args import prepare_server_args
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
CASES = {
    "chain": [], "b15": ["--speculative-ddtree-budget", "15"], "b2": ["--speculative-ddtree-budget", "2"],
    "b64_block8": ["--speculative-ddtree-budget", "64", "--speculative-dflash-block-size", "8"],
    "zero": ["--speculative-ddtree-budget", "0"], "too_big": ["--speculative-ddtree-budget", "1024"],
    "page16": ["--speculative-ddtree-budget", "15", "--page-size", "16"],
    "flashinfer": ["--speculative-ddtree-budget", "15", "--attention-backend", "flashinfer"],
    "flashinfer_allowed": ["--speculative-ddtree-budget", "15", "--attention-backend", "flashinfer",
                           "--speculative-ddtree-allow-unproven"],
    "fa3": ["--speculative-ddtree-budget", "15", "--attention-backend", "fa3", "--speculative-ddtree-allow-unproven"],
    "num_draft_tokens": ["--speculative-ddtree-budget", "15", "--speculative-num-draft-tokens", "8"],
    "deterministic": ["--speculative-ddtree-budget", "15", "--enable-deterministic-inference"],
    "grammar": ["--speculative-ddtree-budget", "15", "--grammar-backend", "xgrammar"],
    "block64": ["--speculative-ddtree-budget", "15", "--speculative-dflash-block-size", "64"],
}
out = {}
for name, extra in CASES.items():
    try:
        sa = prepare_server_args(common + extra)
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        publish(sa)
        algo = SpeculativeAlgorithm.DFLASH
        # 0.5.16 renamed the width hook (the old name stays as a deprecated alias); 0.5.14/15 have the old one only
        width = (getattr(algo, "get_num_tokens_per_req_for_target_verify", None)
                 or algo.get_num_tokens_per_bs_for_target_verify)
        n = sa.speculative_num_draft_tokens
        draft = draft_server_args(sa)  # what the 0.5.14-0.5.16 workers build their draft worker from
        out[name] = {"ok": True, "num_draft_tokens": n, "block_size": sa.speculative_dflash_block_size,
                     "budget": sa.speculative_ddtree_budget, "topk": sa.speculative_eagle_topk,
                     "target_width": width(n, False), "draft_width": width(n, True),
                     "copy_is_target": draft is sa, "copy_num_draft_tokens": draft.speculative_num_draft_tokens,
                     "copy_draft_width": width(draft.speculative_num_draft_tokens, True),
                     "target_after_copy": sa.speculative_num_draft_tokens}
    except Exception as e:
        out[name] = {"ok": False, "type": type(e).__name__, "msg": str(e)}
# EAGLE with a budget: refused before any EAGLE handling
try:
    prepare_server_args(["--model-path", tgt, "--skip-tokenizer-init", "--speculative-algorithm", "EAGLE",
                         "--speculative-draft-model-path", drf, "--speculative-ddtree-budget", "15"])
    out["eagle"] = {"ok": True}
except Exception as e:
    out["eagle"] = {"ok": False, "type": type(e).__name__, "msg": str(e)}
from types import SimpleNamespace
from sglang.srt.speculative.ddtree_v2.config import kv_reservation, draft_width
out["reserve"] = [kv_reservation(100, 16, 65), kv_reservation(100, 16, 3), kv_reservation(7, 8, 8),
                  draft_width(SimpleNamespace(speculative_ddtree_budget=None, speculative_dflash_block_size=16)),
                  draft_width(SimpleNamespace(speculative_ddtree_budget=64, speculative_dflash_block_size=16))]
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def resolved(v2_tree: Path, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("args")
    tgt, drf = model_dirs(work, TARGET, dict(
        TARGET, architectures=["DFlashDraftModel"], num_hidden_layers=1, layer_types=["full_attention"],
        num_target_layers=4, block_size=4, dflash_config={"block_size": 4, "target_layer_ids": [0, 2],
                                                          "mask_token": "<|mask|>", "mask_token_id": 3}))
    r = run_python(v2_tree, work, SCRIPT, str(tgt), str(drf), fake_cuda=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(line[len("RESULT"):])


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
    ("zero", ["positive integer"]),
    ("too_big", ["verify width", "1024"]),
    ("page16", ["--page-size 16"]),
    ("flashinfer", ["not proven", "--attention-backend flashinfer", "--speculative-ddtree-allow-unproven"]),
    ("fa3", ["does not support", "fa3", "cascade"]),
    ("num_draft_tokens", ["do not pass --speculative-num-draft-tokens"]),
    ("deterministic", ["--enable-deterministic-inference"]),
    ("block64", ["block size of 64"]),
    ("eagle", ["requires --speculative-algorithm DFLASH"]),
])
def test_refusals_name_the_flag(resolved, case, words):
    c = resolved[case]
    assert not c["ok"] and c["type"] == "ValueError", c
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


def test_unproven_backend_runs_when_allowed(resolved):
    c = resolved["flashinfer_allowed"]
    assert c["ok"] and c["num_draft_tokens"] == 16, c


def test_kv_reservation_covers_draft_and_verify(v2_tree: Path, resolved):
    # committed + one stale round (a block) + the wider of draft block and verify width
    assert resolved["reserve"] == [181, 132, 23, None, 16]
    prep = (v2_tree / "sglang/srt/speculative/dflash_info_v2.py").read_text()
    assert "committed_len + reserve_ahead" in prep
