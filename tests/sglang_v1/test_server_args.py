"""`--speculative-ddtree-budget` resolution in the patched sglang 0.5.11 ServerArgs (device="cuda", on CPU).

Runs in a subprocess against the whole patched package (conftest `patched_tree`). Importing
sglang.srt.server_args needs SGLang's Python dependencies (tests/sglang_v1/requirements-cpu.txt, installed with --no-deps). Without them the
test is skipped with the missing module's name, unless DDTREE_REQUIRE_SGLANG_DEPS=1 (then it fails).
torchvision is replaced by a small stand-in package (a real package directory with dist-info), never installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sglang_series_helpers import sglang_subprocess_env

TARGET = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=512, hidden_size=64,
              intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
              torch_dtype="bfloat16", eos_token_id=0, bos_token_id=0)

SCRIPT = textwrap.dedent('''
    import json, sys
    from sglang.srt.server_args import ServerArgs
    tgt, drf = sys.argv[1], sys.argv[2]
    def mk(**kw):
        base = dict(model_path=tgt, speculative_algorithm="DFLASH", speculative_draft_model_path=drf,
                    device="cuda", skip_tokenizer_init=True, attention_backend="triton")
        base.update(kw)
        return ServerArgs(**base)
    out = {}
    def case(name, **kw):
        try:
            a = mk(**kw)
            out[name] = {"ok": True, "num_draft_tokens": a.speculative_num_draft_tokens,
                         "block_size": a.speculative_dflash_block_size, "budget": a.speculative_ddtree_budget,
                         "topk": a.speculative_eagle_topk, "page_size": a.page_size}
        except Exception as e:
            out[name] = {"ok": False, "type": type(e).__name__, "msg": str(e)}
    case("chain")
    case("b15", speculative_ddtree_budget=15)
    case("b1", speculative_ddtree_budget=1)
    case("b64_block8", speculative_ddtree_budget=64, speculative_dflash_block_size=8)
    case("zero", speculative_ddtree_budget=0)
    case("too_big", speculative_ddtree_budget=1024)
    case("flashinfer", speculative_ddtree_budget=15, attention_backend="flashinfer")
    case("page16", speculative_ddtree_budget=15, page_size=16)
    case("num_draft_tokens", speculative_ddtree_budget=15, speculative_num_draft_tokens=8)
    case("window", speculative_ddtree_budget=15, speculative_dflash_draft_window_size=64)
    case("eagle", speculative_ddtree_budget=15, speculative_algorithm="EAGLE")
    case("block64", speculative_ddtree_budget=15, speculative_dflash_block_size=64)
    # the spec-v2 bases' flags that would do nothing alone do not exist here: the command line refuses them
    import contextlib, io
    from sglang.srt.server_args import prepare_server_args
    for name, flag in (("cli_unproven", ["--speculative-ddtree-allow-unproven"]),
                       ("cli_schedule", ["--speculative-ddtree-schedule", "1:15"])):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                prepare_server_args(["--model-path", tgt, "--speculative-algorithm", "DFLASH",
                                     "--speculative-draft-model-path", drf, "--device", "cuda",
                                     "--skip-tokenizer-init", "--attention-backend", "triton",
                                     "--speculative-ddtree-budget", "15"] + flag)
            out[name] = {"ok": True}
        except SystemExit as e:
            out[name] = {"ok": False, "type": "SystemExit", "code": e.code, "msg": err.getvalue()}
    print("RESULT" + json.dumps(out))
''')


@pytest.fixture(scope="module")
def resolved(patched_tree: Path, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("sa")
    tgt, drf = d / "tgt", d / "drf"
    tgt.mkdir()
    drf.mkdir()
    (tgt / "config.json").write_text(json.dumps(TARGET))
    draft = dict(TARGET, architectures=["DFlashDraftModel"], num_hidden_layers=1, layer_types=["full_attention"],
                 num_target_layers=4, block_size=4,
                 dflash_config={"block_size": 4, "target_layer_ids": [0, 2], "mask_token": "<|mask|>",
                                "mask_token_id": 3})
    (drf / "config.json").write_text(json.dumps(draft))
    env = sglang_subprocess_env(patched_tree, d)  # patched tree, optional deps dir, torchvision stand-in
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tgt), str(drf)], capture_output=True, text=True, env=env,
                       timeout=600, cwd=d)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        missing = [ln for ln in r.stderr.splitlines() if "No module named" in ln or "was not found" in ln]
        msg = f"sglang.srt.server_args does not import here: {(missing or r.stderr.splitlines() or ['?'])[-1]}"
        if os.environ.get("DDTREE_REQUIRE_SGLANG_DEPS") == "1" or not missing:
            pytest.fail(msg + "\n" + r.stderr[-3000:])
        pytest.skip(msg)
    return json.loads(line[len("RESULT"):])


def test_chain_is_unchanged(resolved):
    r = resolved["chain"]
    assert r["ok"] and r["budget"] is None
    assert r["num_draft_tokens"] == 4  # the draft config's block size, as stock DFLASH resolves it


@pytest.mark.parametrize("case,budget,block", [("b15", 15, 4), ("b1", 1, 4), ("b64_block8", 64, 8)])
def test_verify_width_is_budget_plus_one_independent_of_block(resolved, case, budget, block):
    r = resolved[case]
    assert r["ok"], r
    assert r["num_draft_tokens"] == budget + 1
    assert r["block_size"] == block
    assert r["topk"] == 1 and r["page_size"] == 1


@pytest.mark.parametrize("case,needle", [
    ("zero", "must be a positive integer"),
    ("too_big", "must be <= 1024"),
    ("flashinfer", "use --attention-backend triton"),
    ("page16", "needs --page-size 1"),
    ("num_draft_tokens", "do not pass --speculative-num-draft-tokens"),
    ("window", "--speculative-dflash-draft-window-size"),
    ("eagle", "requires --speculative-algorithm DFLASH"),
    ("block64", "block size <= 32"),
])
def test_bad_combinations_are_rejected_clearly(resolved, case, needle):
    r = resolved[case]
    assert not r["ok"] and r["type"] == "ValueError", r
    assert needle in r["msg"], r["msg"]


@pytest.mark.parametrize("case,flag", [("cli_unproven", "--speculative-ddtree-allow-unproven"),
                                       ("cli_schedule", "--speculative-ddtree-schedule")])
def test_flags_of_the_spec_v2_bases_are_unknown_here(resolved, case, flag):
    """0.5.11 has the budget flag only (no allow-unproven gate: what is not proven is refused outright, and
    GatedDeltaNet hybrids run by default through 0004; no schedules): the others are refused by the command line,
    exit 2."""
    r = resolved[case]
    assert not r["ok"] and r["type"] == "SystemExit" and r["code"] == 2, r
    assert "unrecognized arguments" in r["msg"] and flag in r["msg"], r["msg"]
