"""DDTree on hybrid GatedDeltaNet targets on SGLang 0.5.17 (patch 0004 + ``ddtree_v2.hybrid``), on CPU, against the
real patched wheel.

1. The verify as wired: the GPU harness (``tests/gpu/test_hybrid_v2_kernels_gpu.py``) run with ``--cpu-smoke`` in the
   patched tree: the real ``GDNAttnBackend`` graph-replay / eager metadata and ``forward_extend`` (TARGET_VERIFY through
   the runtime's Triton kernels, interpreted), the real worker commit, at Qwen3.6 head dims, budgets 1/16/64/256,
   batches up to 16, against float64 per-path recurrences.
2. The start-up refusals, each naming the family or flag, through ``DDTreeRound.check_target`` on the real classes;
   0.5.16 (no 0004) keeps refusing hybrids.
3. Server arguments of a hybrid target with DDTree and the ``extra_buffer`` strategy, resolved as on an H200; the
   memory check at the boundary (the largest budget that fits passes, one more is refused naming it), with the
   base's own mamba slot ratio; the conv-window layout switch.
4. The hooks sit where the base reads them (0004 stays a separable patch on top of 0003).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from v2_helpers import BASES, REFUSAL_BASES, REPO, TRAITS, model_dirs, run_python, script_result, with_trait

HARNESS = REPO / "tests" / "gpu" / "test_hybrid_v2_kernels_gpu.py"
NEXT_TARGET = dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", vocab_size=512, hidden_size=128,
                   intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
                   linear_num_key_heads=2, linear_num_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=64,
                   shared_expert_intermediate_size=64, num_experts_per_tok=2, num_experts=4, full_attention_interval=4,
                   layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=4096,
                   eos_token_id=0, bos_token_id=0, tie_word_embeddings=False, torch_dtype="bfloat16",
                   rms_norm_eps=1e-6, rope_theta=10000.0)


def _result(r) -> dict:
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}"
    return json.loads(line[len("RESULT"):])


# ------------------------------------------------------------------------------------------ 1. the wired verify


def test_wired_tree_verify_and_commit_against_float64(v2_trees, tmp_path: Path):
    out = tmp_path / "kernels.json"
    code = ("import runpy, sys\nsys.argv = ['harness', '--cpu-smoke', '--out', sys.argv[1]]\n"
            f"runpy.run_path({str(HARNESS)!r}, run_name='__main__')\n")
    r = run_python(v2_trees("0.5.17"), tmp_path, code, str(out), timeout=1500)
    assert out.exists(), f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}"
    res = json.loads(out.read_text())
    bad = [c for c in res["cases"] if not c["ok"]]
    assert not bad, json.dumps(bad, indent=1)[:6000]
    assert res["ok"] and r.returncode == 0
    specs = [c["spec"] for c in res["cases"]]
    assert {s["budget"] for s in specs} == {1, 16, 64, 256}
    assert max(s["batch"] for s in specs) == 8  # batch 16: the GPU cases
    assert res["shapes"]["head_k_dim"] == res["shapes"]["head_v_dim"] == 128  # Qwen3.6's head dims
    assert res["shapes"]["num_v_heads"] == 3 * res["shapes"]["num_k_heads"]  # and its 48:16 head ratio
    by = {c["case"]: c for c in res["cases"]}
    assert any(s["graph"] and s["pad"] for s in specs), "a graph replay with padded rows"
    assert any(s["kind"] == "ties" for s in specs)
    chains = [c for c in res["cases"] if c["spec"]["kind"] == "chain"]
    assert chains and all(c["accept_len_max"] == 15 for c in chains), "the deepest chain the drafter allows"
    tracked = [c for c in res["cases"] if c["spec"]["track"]]
    assert tracked and all(c.get("tracked", 0) > 0 for c in tracked), "the track rule fired"
    for c in by.values():
        assert c["max_state_err"] < 1e-4 and c["max_out_err"] < 1e-4 and c["window_exact"], c
        assert c["commit_equals_sequential_path"] and c["others_untouched"], c


# ------------------------------------------------------------------------------------------ 2. refusals



@pytest.fixture(scope="module")
def refusals(v2_scripts_for) -> dict:
    """v2_helpers.REFUSALS_SCRIPT's result per base, run in each base's batch of CPU scripts (conftest.py)."""
    return {v: script_result(v2_scripts_for(v), "refusals") for v in REFUSAL_BASES}


def test_dflash2_drafter_is_refused_at_start_up(refusals):
    """0.5.19+ serve DFlash2 drafters through a candidate selector and 0.5.20+ Domino drafters through a GRU
    rollout; DDTree reads neither, so both are refused at worker start with the reason, and a DFlash1 drafter
    starts."""
    for base in with_trait("hybrid"):
        assert refusals[base]["dflash1"] == {"ok": True, "hybrid": True}, base
    for base in refusals:
        got = refusals[base]["dflash2"]
        assert not got["ok"] and "a DFlash2 drafter" in got["msg"] and "candidate selector" in got["msg"], got
        got = refusals[base]["domino"]
        assert not got["ok"] and "a Domino drafter" in got["msg"] and "prefix-GRU" in got["msg"], got


@pytest.mark.parametrize("case, words", [
    ("mamba2", ["Mamba2", "GatedDeltaNet layers only"]),
    ("kda", ["KDA", "Kimi"]),
    ("lightning", ["lightning", "LightningAttentionBackend"]),
    ("short_conv", ["short convolution"]),
    ("flashinfer_verify", ["other than triton", "verify=FlashInferGDNKernel", "--linear-attn-backend triton"]),
    ("flashinfer_decode", ["decode=FlashInferGDNKernel"]),
    ("replayssm", ["ReplaySSM", "--enable-linear-replayssm-spec"]),
    ("replayssm_decode", ["ReplaySSM"]),
    ("dedup_window", ["sliding-window conv scratch"]),
    ("page_major", ["--enable-page-major-kv-layout"]),
    ("not_built", ["incomplete"]),
    ("no_intermediate", ["intermediate states"]),
])
def test_unsupported_hybrids_are_refused_at_start_up(refusals, case, words):
    for base in with_trait("hybrid"):
        got = refusals[base][case]
        assert not got["ok"] and not got["hybrid"], (base, got)
        assert got["msg"].startswith("DDTree (--speculative-ddtree-budget) does not support ")
        for w in words:
            assert w in got["msg"], (base, w, got["msg"])


def test_gdn_hybrid_on_by_default_on_0517_refused_on_0516(refusals):
    """A GatedDeltaNet hybrid with the triton GDN kernels starts on 0.5.17 with the budget alone (no
    --speculative-ddtree-allow-unproven: the ard run and the ties analysis proved it lossless); the worker branches
    its state (.hybrid). 0.5.16 has no patch 0004 and refuses it with the reason, naming the bases that have it.
    The same holds on every base with patch 0004 (spec-v2/bases.py)."""
    assert "0.5.17" in with_trait("hybrid")
    for base in with_trait("hybrid"):
        assert refusals[base]["gdn"] == {"ok": True, "hybrid": True}, base
    old = refusals["0.5.16"]["gdn_unpatched"]
    assert not old["ok"] and f"SGLang {' / '.join(with_trait('hybrid'))} only" in old["msg"], old


# ------------------------------------------------------------------------------------------ 3. args and memory

ARGS = r'''
import json, sys
from types import SimpleNamespace as NS
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.speculative.ddtree_v2 import hybrid
from sglang.srt import server_args as _S

# The argument rules ask whether this is a CUDA build (extra_buffer needs the FLA kernels); answer as the H200 would,
# for those rules only (the fake-CUDA torch of these tests has no torch.version.cuda). Nothing runs on a device.
_S.is_cuda = lambda: True

tgt, drf = sys.argv[1], sys.argv[2]
common = ["--model-path", tgt, "--skip-tokenizer-init", "--attention-backend", "triton", "--grammar-backend", "none",
          "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drf, "--max-running-requests", "8"]
out = {}
for name, extra in {"ddtree_xbuf": ["--speculative-ddtree-budget", "16", "--mamba-radix-cache-strategy", "extra_buffer"],
                    "ddtree_noradix": ["--speculative-ddtree-budget", "64", "--disable-radix-cache"],
                    "chain_xbuf": ["--mamba-radix-cache-strategy", "extra_buffer"]}.items():
    try:
        sa = prepare_server_args(common + extra)
    except Exception as e:
        import traceback
        out[name] = {"ok": False, "msg": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-1500:]}
        continue
    get_context().set_server_args(sa)
    conf = NS(ps=NS(attn_dp_size=1), server_args=sa)
    conf._calculate_mamba_ratio = lambda conf=conf: KVCacheConfigurator._calculate_mamba_ratio(conf)
    rec = {"ok": True, "n1": sa.speculative_num_draft_tokens, "block": sa.speculative_dflash_block_size,
           "extra_buffer": sa.enable_mamba_extra_buffer(), "ratio": conf._calculate_mamba_ratio(),
           "dedup_allowed": hybrid.conv_window_dedup_allowed(), "page_size": sa.page_size}
    per_req = 150 * 2**20  # about Qwen3.6-27B's 48 GDN layers (3 MiB SSM + 60 KiB conv each)
    rest = 60.0
    if sa.speculative_ddtree_budget is not None:
        from sglang.srt.runtime_context import get_memory, get_schedule
        sched = get_schedule()
        auto = sched.max_mamba_cache_size is None and not (get_memory().disable_radix_cache
                                                           and sched.max_running_requests is not None)
        share = sched.mamba_full_memory_ratio / (1 + sched.mamba_full_memory_ratio) if auto else 1.0
        best, avail, per_node = hybrid.max_budget(total_rest_gib=rest, per_req_bytes=per_req, max_running_requests=8,
                                                  slots_per_req=rec["ratio"], mamba_share=share)
        rec.update(share=share, best=best, per_node=per_node, avail=avail)
        # the boundary, through the hook's entry point with the published arguments: budget = best passes ...
        at = [a if a != "16" and a != "64" else str(best) for a in extra]
        get_context().set_server_args(prepare_server_args(common + at))
        hybrid.check_memory_for_pool(conf, rest, per_req)
        rec["best_passes"] = True
        over = [a if a != "16" and a != "64" else str(best + 1) for a in extra]  # ... one more is refused
        get_context().set_server_args(prepare_server_args(common + over))
        try:
            hybrid.check_memory_for_pool(conf, rest, per_req)
            rec["over_refused"] = None
        except ValueError as e:
            rec["over_refused"] = str(e)
    else:
        hybrid.check_memory_for_pool(conf, 0.001, per_req)  # DDTree off: never refuses
        rec["chain_no_check"] = True
    out[name] = rec
try:
    hybrid.check_memory(budget=1, total_rest_gib=0.1, per_req_bytes=2**30, max_running_requests=4)
    out["no_root"] = None
except ValueError as e:
    out["no_root"] = str(e)
print("RESULT" + json.dumps(out))
'''


#: a block-16 DFlash drafter for NEXT_TARGET (configs only: server arguments read no more)
NEXT_DRAFTER = dict(architectures=["DFlashDraftModel"], model_type="qwen3", vocab_size=512, hidden_size=128,
                    intermediate_size=256, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, layer_types=["full_attention"], num_target_layers=4, block_size=16,
                    max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0, torch_dtype="bfloat16",
                    tie_word_embeddings=False, dflash_config={"block_size": 16, "target_layer_ids": [0, 2],
                                                              "mask_token": "<|mask|>", "mask_token_id": 3})


@pytest.fixture(scope="module")
def hybrid_args(v2_trees, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("hybrid-args")
    tgt, drf = model_dirs(work, NEXT_TARGET, NEXT_DRAFTER)
    return _result(run_python(v2_trees("0.5.17"), work, ARGS, str(tgt), str(drf), fake_cuda=True))


def test_hybrid_target_with_extra_buffer_resolves(hybrid_args):
    x = hybrid_args["ddtree_xbuf"]
    assert x["ok"], x
    assert (x["n1"], x["block"], x["page_size"]) == (17, 16, 1)
    assert x["extra_buffer"] and x["ratio"] > 1, "the extra_buffer strategy keeps more than one slot per request"
    assert x["dedup_allowed"] is False, "DDTree keeps one conv window per node"
    chain = hybrid_args["chain_xbuf"]
    assert chain["ok"] and chain["dedup_allowed"] is True and chain["chain_no_check"]


@pytest.mark.parametrize("case", ["ddtree_xbuf", "ddtree_noradix"])
def test_memory_check_boundary_names_the_largest_budget(hybrid_args, case):
    x = hybrid_args[case]
    assert x["ok"], x
    per_req = 150 * 2**20
    assert x["per_node"] == per_req * 9  # (8 max running requests + the padding row) x per request
    # the arithmetic the check is built on: best + 1 nodes fit what is left after the requests' own states
    assert (x["best"] + 1) * x["per_node"] <= x["avail"] < (x["best"] + 2) * x["per_node"]
    assert x["best_passes"]
    msg = x["over_refused"]
    assert msg and f"the largest budget that fits is {x['best']}" in msg and "--max-running-requests" in msg
    if case == "ddtree_noradix":
        assert x["share"] == 1.0 and x["ratio"] == 1  # explicit sizes: the whole rest; one slot per request
    else:
        assert x["share"] < 1.0


AUTO = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt import server_args as _S
from sglang.srt.speculative.ddtree import schedule as SCHED
_S.is_cuda = lambda: True  # as on the H200, for the argument rules only (see test 3)
tgt, drf = sys.argv[1], sys.argv[2]
sa = prepare_server_args(["--model-path", tgt, "--skip-tokenizer-init", "--attention-backend", "triton",
                          "--grammar-backend", "none", "--speculative-algorithm", "DFLASH",
                          "--speculative-draft-model-path", drf, "--speculative-ddtree-budget", "auto",
                          "--max-running-requests", "8", "--disable-radix-cache"])
print("RESULT" + json.dumps({"schedule": sa.speculative_ddtree_schedule,
                             "hybrid": str(SCHED.default_schedule(range(1, 513), block_size=16, hybrid=True)),
                             "dense": str(SCHED.default_schedule(range(1, 513), block_size=16))}))
"""


def test_auto_prices_a_hybrid_target_with_the_hybrid_table(v2_trees, tmp_path: Path):
    """`--speculative-ddtree-budget auto` on a GatedDeltaNet hybrid resolves with the hybrid cost table (its GDN
    verify grows with every node, budgets bounded by what fits), not the dense one."""
    tgt, drf = model_dirs(tmp_path, NEXT_TARGET, NEXT_DRAFTER)
    got = _result(run_python(v2_trees("0.5.17"), tmp_path, AUTO, str(tgt), str(drf), fake_cuda=True))
    assert got["schedule"] == got["hybrid"] != got["dense"], got


def test_memory_check_when_not_even_the_root_fits(hybrid_args):
    msg = hybrid_args["no_root"]
    assert msg and "not even the root fits" in msg and "largest budget that fits is 0" in msg


# ------------------------------------------------------------------------------------------ 4. hooks


@pytest.mark.parametrize("base", with_trait("hybrid"))
def test_hooks_sit_where_the_base_reads_them(v2_trees, base):
    tree = v2_trees(base) / "sglang" / "srt"
    # the GDN backend is the base's own file: its four hooks come through SGLang's plugin framework (the tree verify
    # attached after __init__, the parents filled after the eager and the graph-replay metadata, TARGET_VERIFY
    # around forward_extend), each checked against its definition's sha256 (test_v2_plugin.py)
    assert "ddtree" not in (tree / "layers/attention/linear/gdn_backend.py").read_text()
    table = json.loads((tree / "speculative/ddtree_v2/plugin_hooks.json").read_text())
    gdn = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend."
    assert sorted((h["target"].removeprefix(gdn), h["type"], h["hook"].split(":")[1]) for h in table["hooks"]
                  if h["target"].startswith(gdn)) == [
        ("__init__", "after", "gdn_attach"), ("forward_extend", "around", "gdn_forward_extend"),
        ("init_forward_metadata", "after", "gdn_fill"), ("init_forward_metadata_out_graph", "after", "gdn_fill")]
    conf = (tree / "mem_cache/kv_cache_configurator.py").read_text()
    # the chunk-form verify's per-node records: the base sizes its scratch by what the hook says
    call = ("step_per_req = check_memory_for_pool(\n                    self,\n                    total_rest_memory,"
            "\n                    stage_per_req,\n                    config.mamba2_cache_params,")
    assert conf.index(call) < conf.index('"mamba_pool.memory_budget_spec"'), "the check runs before the sizing"
    sizing = conf[conf.index(call):]
    assert sizing.count("step_per_req") >= 5 and "per_req * (1 + D)" not in sizing, "every reservation resized"
    pool = (tree / "mem_cache/memory_pool.py").read_text()
    assert "and _ddtree_conv_window_dedup_allowed()" in pool
    assert "= _ddtree_intermediate_ssm_layout(" in pool, "the per-step SSM scratch takes DDTree's layout"
    worker = (tree / "speculative/dflash_worker_v2.py").read_text()
    i = worker.index("def _update_target_mamba_state_after_verify")
    body = worker[i: worker.index("def _ensure_accept_bonus_buffers")]
    # the base's tracking rule is computed first, then DDTree's commit replaces the chain's scatter
    assert body.index("mamba_steps_to_track = torch.where(") < body.index("accepted_nodes=accepted_nodes") < body.index(
        "update_mamba_state_after_mtp_verify(")
    for old in (v for v in BASES if not TRAITS[v].hybrid):
        assert "ddtree" not in (v2_trees(old) / "sglang/srt/layers/attention/linear/gdn_backend.py").read_text()


# ------------------------------------------------------------------------------------------ 5. the 27B shape

# The set-up the scripts below share: one rank, on CPU, as the H200 would resolve arguments.
ONE_RANK = r"""
import types
from sglang.srt import server_args as _S
from sglang.srt.distributed import parallel_state as ps
from sglang.srt.layers import dp_attention as _dp
from sglang.srt.layers.rotary_embedding import base as _rope

_S.is_cuda = lambda: True  # as on the H200, for the argument rules only (see test 3)
# one-rank stand-ins for the process groups the model code asks for its TP size (world of one: TP 1)
_g = types.SimpleNamespace(world_size=1, rank=0, rank_in_group=0, local_rank=0, ranks=[0], is_first_rank=True,
                           is_last_rank=True, first_rank=0, last_rank=0, device_group=None, cpu_group=None,
                           unique_name="one")
for n in ("_WORLD", "_TP", "_ATTN_TP", "_ATTN_CP", "_DCP", "_MOE_DP", "_MOE_EP", "_MOE_TP", "_PP"):
    setattr(ps, n, _g)
_dp._ATTN_DP_RANK, _dp._ATTN_DP_SIZE = 0, 1  # no DP attention
# the rotary embedding's native path (this torch reports a fake CUDA without a CUDA build: its fused kernel is
# looked for in vllm otherwise); nothing else differs from the GPU's construction
_rope._is_cpu = True
"""

Q36 = r'''
import json, sys
from sglang.srt import server_args as _S
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mambaish_config
from sglang.srt.speculative.dflash_utils import get_dflash_layer_types, parse_dflash_draft_config
from sglang.srt.speculative.ddtree_v2 import hybrid

tgt, drf = sys.argv[1], sys.argv[2]
sa = prepare_server_args(["--model-path", tgt, "--skip-tokenizer-init", "--load-format", "dummy", "--attention-backend",
                          "triton", "--grammar-backend", "none", "--speculative-algorithm", "DFLASH",
                          "--speculative-draft-model-path", drf, "--speculative-ddtree-budget", "16",
                          "--mamba-radix-cache-strategy", "extra_buffer", "--max-running-requests", "16",
                          "--mamba-full-memory-ratio", "8.0"])
get_context().set_server_args(sa)
mc = ModelConfig.from_server_args(sa)
dc = ModelConfig.from_server_args(sa, model_path=drf, is_draft_model=True)
gdn = hybrid_gdn_config(mc)
params = mambaish_config(mc).mamba2_cache_params
draft = parse_dflash_draft_config(draft_hf_config=dc.hf_config)
per_req = int(params.mamba_cache_per_req)
fits = {r: hybrid.max_budget(total_rest_gib=65.0, per_req_bytes=per_req, max_running_requests=r, slots_per_req=5,
                             mamba_share=8 / 9)[0] for r in (1, 2, 4, 8, 16)}
node = hybrid.node_bytes_per_req(per_req, params)  # the chunk-form verify (the default): records, not states
fits_chunk = {r: hybrid.max_budget(total_rest_gib=65.0, per_req_bytes=per_req, max_running_requests=r,
                                   slots_per_req=5, mamba_share=8 / 9, node_bytes=node)[0] for r in (1, 2, 4, 8, 16)}
print("RESULT" + json.dumps({
    "arch": mc.hf_config.architectures, "n1": sa.speculative_num_draft_tokens, "block": sa.speculative_dflash_block_size,
    "gdn": gdn is not None, "linear_layers": len(params.layers), "per_req": per_req,
    "heads": [gdn.linear_num_key_heads, gdn.linear_num_value_heads, gdn.linear_key_head_dim, gdn.linear_value_head_dim,
              gdn.linear_conv_kernel_dim], "hidden": gdn.hidden_size, "layers": gdn.num_hidden_layers,
    "ssm_dtype": str(params.dtype.temporal), "draft_layer_types": list(get_dflash_layer_types(dc.hf_config)),
    "draft_block": draft.block_size, "target_layer_ids": list(draft.target_layer_ids or []),
    "mask_id": draft.mask_token_id, "fits": fits, "fits_chunk": fits_chunk, "node_chunk": node}))
'''


def test_qwen36_27b_shape_loads_as_a_gdn_hybrid_and_its_budgets_fit(v2_trees, tmp_path: Path):
    """The e2e 27B-shape models (bench/e2e/models/mk_shapes.py) as SGLang 0.5.17 reads them, and the budgets the e2e
    configurations pair with each max-running-requests value fitting the start-up check's arithmetic."""
    import subprocess
    import sys

    base = tmp_path / "base"
    (base / "tiny-qwen3").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "bench.e2e.models.mk_shapes", str(tmp_path / "m"), str(base)], check=True,
                   cwd=REPO, capture_output=True)
    got = _result(run_python(v2_trees("0.5.17"), tmp_path, ONE_RANK + Q36, str(tmp_path / "m/q36-target"),
                             str(tmp_path / "m/q36-dflash"), fake_cuda=True))
    assert got["arch"] == ["Qwen3_5ForConditionalGeneration"] and got["gdn"]
    assert (got["layers"], got["hidden"], got["linear_layers"]) == (64, 5120, 48)
    assert got["heads"] == [16, 48, 128, 128, 4]
    assert got["ssm_dtype"] == "torch.float32"
    assert got["per_req"] == 48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 3 * 2)
    assert (got["n1"], got["block"], got["draft_block"]) == (17, 16, 16)
    assert got["draft_layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert got["target_layer_ids"] == [1, 16, 31, 46, 61] and got["mask_id"] == 248070
    fits = {int(k): v for k, v in got["fits"].items()}
    # the e2e q36 configurations (bench/e2e/hybrid_v2.sh): b16 at 16 requests, b32 at 8, b64 at 4, b128 at 1
    assert fits[16] >= 16 and fits[8] >= 32 and fits[4] >= 64 and fits[1] >= 128
    assert fits[16] < 32 and fits[8] < 64 and fits[4] < 128, "the cells left out really do not fit"
    # the chunk form: conv windows (10240 x 3 bf16) + records (48 value heads x 257 floats) per node and GDN layer
    assert got["node_chunk"] == 48 * (10240 * 3 * 2 + 48 * 257 * 4)
    chunk = {int(k): v for k, v in got["fits_chunk"].items()}
    assert chunk[16] >= 64 and chunk[8] >= 128 and chunk[1] >= 256, chunk


DRAFTER = r"""
import json, sys
import torch, transformers
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.models.dflash import DFlashDraftModel

tgt = sys.argv[1]
out = {"transformers": transformers.__version__}
for name, drf in (("generated", sys.argv[2]), ("without_use_sliding_window", sys.argv[3])):
    try:
        sa = prepare_server_args(["--model-path", tgt, "--skip-tokenizer-init", "--load-format", "dummy",
                                  "--attention-backend", "triton", "--grammar-backend", "none",
                                  "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drf,
                                  "--speculative-ddtree-budget", "16", "--max-running-requests", "16"])
        get_context().set_server_args(sa)
        hf = ModelConfig.from_server_args(sa, model_path=drf, is_draft_model=True).hf_config
        rec = {"config": type(hf).__name__, "sliding_window": hf.sliding_window, "layer_types": list(hf.layer_types)}
        with torch.device("meta"):  # the drafter's modules at full size, without memory
            model = DFlashDraftModel(hf)
        rec["layers"] = [[layer.self_attn.attn.sliding_window_size, layer.self_attn.attn.attn_type.name]
                         for layer in model.layers]
        rec["params"] = sum(p.numel() for p in model.parameters())
        out[name] = {"ok": True, **rec}
    except Exception as e:
        out[name] = {"ok": False, "msg": f"{type(e).__name__}: {e}"}
print("RESULT" + json.dumps(out))
"""


def test_qwen36_27b_drafter_keeps_its_sliding_window_and_builds(v2_trees, tmp_path: Path):
    """The 27B-shape drafter of mk_shapes.py, read by SGLang 0.5.17 through transformers 5.12.1 (the version
    0.5.17 pins, the one in the 0.5.17 GPU bundle's wheels and in the spec-v2 dependency folder), keeps its 2048
    window, and SGLang's DFlashDraftModel builds its five layers (on the meta device): four sliding layers with
    window_left 2047, one full non-causal layer. The same config without ``use_sliding_window`` is what the engines
    died of on the H200: transformers drops the window and SGLang refuses the sliding layers."""
    import subprocess
    import sys

    from v2_helpers import pinned

    base = tmp_path / "base"
    (base / "tiny-qwen3").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "bench.e2e.models.mk_shapes", str(tmp_path / "m"), str(base)], check=True,
                   cwd=REPO, capture_output=True)
    drafter = tmp_path / "m" / "q36-dflash"
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["use_sliding_window"] is True and cfg["sliding_window"] == 2048
    old = tmp_path / "old-dflash"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "use_sliding_window"}))
    got = _result(run_python(v2_trees("0.5.17"), tmp_path, ONE_RANK + DRAFTER, str(tmp_path / "m" / "q36-target"),
                             str(drafter), str(old), fake_cuda=True))
    assert got["transformers"] == pinned("0.5.17", "transformers") == "5.12.1"
    gen = got["generated"]
    assert gen["ok"], gen
    assert gen["config"] == "Qwen3Config" and gen["sliding_window"] == 2048
    assert gen["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert gen["layers"] == [[2047, "DECODER"]] * 4 + [[-1, "ENCODER_ONLY"]]
    assert gen["params"] > 5 * 5120 * 17408 * 3, "the layers are built at the 27B drafter's width"
    bad = got["without_use_sliding_window"]
    assert not bad["ok"] and "DFLASH sliding_attention layers require config.sliding_window" in bad["msg"], bad


PROFILE36 = r"""
import json, runpy, sys
import torch
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.models.qwen3_5 import Qwen3_5ForCausalLM

tgt, drf, hook = sys.argv[1], sys.argv[2], sys.argv[3]
sa = prepare_server_args(["--model-path", tgt, "--skip-tokenizer-init", "--load-format", "dummy", "--attention-backend",
                          "triton", "--grammar-backend", "none", "--speculative-algorithm", "DFLASH",
                          "--speculative-draft-model-path", drf, "--speculative-ddtree-budget", "16",
                          "--max-running-requests", "4"])
get_context().set_server_args(sa)
text = ModelConfig.from_server_args(sa).hf_config.text_config  # the 27B's text config, shrunk (not its layout)
for k, v in dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
                 linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=2048).items():
    setattr(text, k, v)
model = Qwen3_5ForCausalLM(text)
profile = json.loads(open(tgt + "/profile.json").read())
H = runpy.run_path(hook)  # bench/e2e/profile_weights/sitecustomize.py (without E2E_PROFILE_JSON: no import hook)
with torch.no_grad():
    for _, p in model.named_parameters():
        p.normal_()
    for m in model.modules():
        if hasattr(m, "gemma_weight"):
            m.gemma_weight.normal_()
done = H["apply_profile"](model, profile)
P = dict(model.named_parameters())
gemma = [m for m in model.modules() if type(m).__name__ == "GemmaRMSNorm"]
zero = [n for n in P if n.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight"))]
u = torch.zeros(1, 64)
u[0, 0] = 1.0
h = model.norm.forward_native(u.to(torch.bfloat16)).float()
print("RESULT" + json.dumps({
    "set": len(done), "gemma": len(gemma), "gemma_weight_zero": all(bool((m.weight == 0).all()) for m in gemma),
    "gemma_scale_one": all(bool((m.gemma_weight == 1).all()) for m in gemma if hasattr(m, "gemma_weight")),
    "zeroed": sorted(zero), "all_zero": all(bool((P[n] == 0).all()) for n in zero),
    "embed_e0": bool((P["embed_tokens.weight"][:, 0] == 1).all() and (P["embed_tokens.weight"][:, 1:] == 0).all()),
    "norm_out": [float(h[0, 0]), float(h[0, 1:].abs().max())]}))
"""


def test_prof36_profile_holds_on_the_real_qwen36_layers(v2_trees, tmp_path: Path):
    """The controlled-acceptance hook (bench/e2e/profile_weights) on SGLang 0.5.17's own Qwen3.5/3.6 model classes
    (text model shrunk to hidden 64, its 3 GatedDeltaNet + 1 gated-attention layer pattern kept): every layer's
    output projection is zero (the GDN layers' out_proj included), every Gemma-style norm scales by one, the
    embedding is e0, so the final norm maps u = e0 to h0 e0 as models/mk_profile.py computes the logits from."""
    import subprocess
    import sys

    base = tmp_path / "base"
    (base / "tiny-qwen3").mkdir(parents=True)
    for mod in ("mk_shapes", "mk_profile"):
        subprocess.run([sys.executable, "-m", f"bench.e2e.models.{mod}", str(tmp_path / "m"), str(base)], check=True,
                       cwd=REPO, capture_output=True)
    prof = json.loads((tmp_path / "m" / "prof36-target" / "profile.json").read_text())
    assert (prof["hidden_size"], prof["vocab_size"]) == (5120, 248320)
    got = _result(run_python(v2_trees("0.5.17"), tmp_path, ONE_RANK + PROFILE36, str(tmp_path / "m" / "prof36-target"),
                             str(tmp_path / "m" / "prof36-dflash"),
                             str(REPO / "bench/e2e/profile_weights/sitecustomize.py"), fake_cuda=True))
    assert got["gemma"] > 0 and got["gemma_weight_zero"] and got["gemma_scale_one"], got
    assert got["all_zero"] and sum(".linear_attn.out_proj." in n for n in got["zeroed"]) == 3, got["zeroed"]
    assert sum(n.endswith(".o_proj.weight") for n in got["zeroed"]) == 1 and got["embed_e0"], got
    h0 = 1.0 / (1.0 / 64 + 1e-6) ** 0.5  # mk_profile.realised_logits' h0 at hidden 64 (bf16 output)
    assert abs(got["norm_out"][0] - h0) <= 0.01 * h0 and got["norm_out"][1] == 0.0, got["norm_out"]


# ------------------------------------------------------------------------------------------ 6. the `ard` reference

ARD = r'''
import json, os, runpy, sys
os.environ["TRITON_INTERPRET"] = "1"; os.environ["DDTREE_HYBRID_IMPL"] = "triton"; os.environ["E2E_GDN_DECODE"] = "tree"
os.environ["DDTREE_GDN_VERIFY"] = sys.argv[4]  # the bit-exact reference holds for the recurrent form
from types import SimpleNamespace as NS
sys.path.append(sys.argv[3])  # the repository root, as bench/e2e/driver.py's config_env puts it for the hook
runpy.run_path(sys.argv[1])  # bench/e2e/gdn_unpacked_decode/sitecustomize.py: its import hook, before SGLang loads
from sglang.srt.plugins import load_plugins  # then SGLang's plugins, as a server process does after sitecustomize
load_plugins()
H = runpy.run_path(sys.argv[2], run_name="harness")  # tests/gpu/test_hybrid_v2_kernels_gpu.py: backend, layer set-up
import torch
B = H["base"]()
hooked = B.GDN.forward_decode.__module__ != B.GDN.forward_extend.__module__
shapes, dtype, dev = H["CPU"], torch.float32, "cpu"
batch, n1 = 3, 5
hv, vd, kd, hk = shapes["num_v_heads"], shapes["head_v_dim"], shapes["head_k_dim"], shapes["num_k_heads"]
dim = 2 * hk * kd + hv * vd
slots = 2 * batch + 4
gen = torch.Generator().manual_seed(5)


def backend(budget):
    return H["gdn_backend"](B, budget=budget, layer_ids=[7], slots=slots, rows=batch + 1, shapes=shapes, device=dev,
                            dtype=dtype)


req_pool = torch.randperm(slots, generator=gen)[:batch]
x = (torch.randn(batch, n1, dim, generator=gen) * 0.7).to(dtype)
a = torch.randn(batch, n1, hv, generator=gen).to(dtype)
bb = torch.randn(batch, n1, hv, generator=gen).to(dtype)
layer = H["gdn_layer"](B, 7, shapes, gen, dev, dtype)


def fb(mode, bs, spec=None):
    return NS(batch_size=bs, req_pool_indices=req_pool.clone(), forward_mode=mode, spec_info=spec, seq_lens_cpu=None,
              num_padding=0, mamba_track_indices=None, mamba_track_mask=None, _original_batch_size=None,
              input_ids=torch.zeros(bs * n1 if spec is not None else bs, dtype=torch.int64))


# DDTree: one verify of a chain of n1 nodes (the wired forward_extend), then the commit of its last node
ver, vpool = backend(n1 - 1)
parent = torch.tensor([[-1] + list(range(n1 - 1))] * batch, dtype=torch.int32)
tree = NS(parent=parent, token=torch.zeros(batch, n1, dtype=torch.int64))
spec = B.VerifyInput(draft_token=tree.token.reshape(-1), positions=None, draft_token_num=n1, custom_mask=None, tree=tree)
f = fb(B.ForwardMode.TARGET_VERIFY, batch, spec)
ver.init_forward_metadata(f)
o_tree = ver.forward_extend(layer, f, mixed_qkv=x.reshape(batch * n1, dim), a=a.reshape(-1, hv), b=bb.reshape(-1, hv))
slot_of = ver.forward_metadata.mamba_cache_indices[:batch].long()
last = torch.full((batch,), n1 - 1, dtype=torch.long)
if ver.ddtree.mode == "chunk":  # the accepted state rebuilt from the records along the path (here: the chain)
    path = torch.arange(n1).expand(batch, n1)
    B.rt.commit_tree_records_layers(vpool.temporal, vpool.inter_ssm, path, last, slot_of, slot_of, impl="triton")
    B.rt.commit_tree_conv_layers(vpool.conv[0], vpool.inter_conv[0], last, slot_of.to(torch.int32), impl="triton")
else:
    B.rt.commit_tree_states_layers(vpool.temporal, vpool.conv[0], vpool.inter_ssm, vpool.inter_conv[0], last,
                                   slot_of.to(torch.int32), impl="triton")

# `ard`: n1 plain decode steps through the hooked forward_decode, from the same starting pool
dec, dpool = backend(n1 - 1)
start = dpool.temporal.clone()  # the state the decode steps start from (the pools are seeded alike)
fd = fb(B.ForwardMode.DECODE, batch)
dec.init_forward_metadata(fd)
assert torch.equal(dec.forward_metadata.mamba_cache_indices[:batch].long(), slot_of)
steps = [dec.forward_decode(layer, fd, mixed_qkv=x[:, i].contiguous(), a=a[:, i].contiguous(), b=bb[:, i].contiguous())
         for i in range(n1)]
o_dec = torch.cat(steps, 1)  # [1, batch * n1 in step-major order, hv, vd]
o_dec = o_dec.view(n1, batch, hv, vd).transpose(0, 1).reshape(1, batch * n1, hv, vd)
print("RESULT" + json.dumps({
    "hooked": hooked,
    "outputs_equal": bool(torch.equal(o_dec, o_tree)),
    "ssm_equal": bool(torch.equal(dpool.temporal, vpool.temporal)),
    "conv_equal": bool(torch.equal(dpool.conv[0], vpool.conv[0])),
    "moved": bool(not torch.equal(dpool.temporal[0, slot_of], start[0, slot_of])),
    "mode": ver.ddtree.mode,
    "out_rel_diff": float((o_dec - o_tree).abs().max() / o_tree.abs().max()),
    "ssm_rel_diff": float((dpool.temporal - vpool.temporal).abs().max() / vpool.temporal.abs().max()),
}))
'''


def test_ard_plain_decode_is_bit_identical_to_ddtree_verify(v2_trees, tmp_path: Path):
    """`ard` (bench/e2e: plain decoding with DDTree's GDN math, the bit-exact reference for DDTree's greedy output on
    hybrids, issue #15): n plain decode steps through the hooked ``GDNAttnBackend.forward_decode`` give the same GDN
    outputs and committed SSM state / conv window, bit for bit, as DDTree's wired verify of the n-node chain and
    its commit (real patched 0.5.17 classes; Triton interpreted)."""
    hook = REPO / "bench" / "e2e" / "gdn_unpacked_decode" / "sitecustomize.py"
    res = _result(run_python(v2_trees("0.5.17"), tmp_path, ARD, str(hook), str(HARNESS), str(REPO), "recurrent",
                             plugins=False, timeout=900))
    assert res["mode"] == "recurrent" and res["out_rel_diff"] == res["ssm_rel_diff"] == 0.0, res
    assert {k: res[k] for k in ("hooked", "outputs_equal", "ssm_equal", "conv_equal", "moved")} == {
        "hooked": True, "outputs_equal": True, "ssm_equal": True, "conv_equal": True, "moved": True}, res


def test_chunk_verify_equals_plain_decode_within_float32_rounding(v2_trees, tmp_path: Path):
    """The default (chunk) GDN verify against the same plain decode steps: the same values up to float32 rounding
    (its sums run in another order, so bit-equality is the recurrent form's property only), the conv window
    bit-equal (a copy), the committed state rebuilt from the records."""
    hook = REPO / "bench" / "e2e" / "gdn_unpacked_decode" / "sitecustomize.py"
    res = _result(run_python(v2_trees("0.5.17"), tmp_path, ARD, str(hook), str(HARNESS), str(REPO), "chunk",
                             plugins=False, timeout=900))
    assert res["mode"] == "chunk" and res["hooked"] and res["moved"] and res["conv_equal"], res
    assert res["out_rel_diff"] < 1e-5 and res["ssm_rel_diff"] < 1e-5, res
