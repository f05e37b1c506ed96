"""Patch 0004 (DDTree on hybrid GatedDeltaNet targets, issue #9) against the real sglang 0.5.11 wheel, on CPU.

0004 does not add recurrent kernels: it hands DDTree's tree to the tree-aware kernels SGLang already has for EAGLE
(``MambaAttnBackendBase.tree_verify``), commits the accepted *node's* intermediate state
(``ddtree_hybrid.path_steps_to_nodes``) and adds two start-up checks. So the heart of this file runs the base's
own Triton kernels (interpreted on CPU) on trees built by the runtime and compares them with float64 per-path
recurrences and with the runtime's plain-torch references; the harness is the GPU script's
(``tests/gpu/test_hybrid_base_kernels_gpu.py``), so CI exercises the very code the H200 runs at model shapes.
The start-up checks are tested on the real classes of the patched tree in a subprocess (they need sglang's
Python dependencies: tests/sglang_v1/requirements-cpu.txt plus einops and msgspec).
"""
from __future__ import annotations

import ast
import json
import os
import py_compile
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch

from sglang_series_helpers import (PSET, REPO, load_module, patchset, sglang_subprocess_env, touched,
                                   unpack, unpack_prefix)

if not torch.cuda.is_available():  # the base kernels run in the Triton interpreter (set before they are decorated)
    os.environ.setdefault("TRITON_INTERPRET", "1")

HARNESS = REPO / "tests" / "gpu" / "test_hybrid_base_kernels_gpu.py"
SEED = int(os.environ.get("DDTREE_TEST_SEED", str(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)))
HYBRID = "sglang/srt/layers/attention/hybrid_linear_attn_backend.py"
# What importing the hybrid backend needs beyond requirements-cpu.txt (installed with --no-deps, verified on
# Python 3.11). While the file does not list them, their absence skips the backend tests even in CI.
EXTRA_DEPS = {"einops": "einops==0.8.2", "msgspec": "msgspec==0.23.0"}
WORKER = "sglang/srt/speculative/dflash_worker.py"


# The GPU script, imported as a module: its checks run here at interpreter-sized shapes.
HARNESS_MOD = load_module("hybrid_base_kernels_harness", HARNESS)


@pytest.fixture(scope="module")
def harness():
    return HARNESS_MOD


@pytest.fixture(scope="module")
def kern(harness, patched_tree: Path):
    """The base kernels, ddtree_hybrid and the runtime, loaded by path from the patched tree."""
    return harness.load_base_kernels(patched_tree / "sglang", tag="hbk_cpu")


# ------------------------------------------------------------------------------------------ 1. the series


@pytest.mark.parametrize("upto", range(3, len(patchset()["series"])))
def test_series_prefixes_before_the_last_byte_compile(base_wheel: Path, tmp_path: Path, upto: int):
    """test_sglang_series covers the prefixes 1 and 2 and the whole series; this covers the rest (0001-0003
    without 0004), so 0004 stays a separable patch."""
    meta = patchset()
    files = sorted({f for p in meta["series"] for f in touched(PSET / p)})
    unpack_prefix(base_wheel, tmp_path, files, upto)
    compiled = 0
    for f in files:
        if (tmp_path / f).exists():
            py_compile.compile(str(tmp_path / f), doraise=True, cfile=str(tmp_path / f) + ".c.pyc")
            compiled += 1
    assert compiled >= len(meta["base"]["files"])


def test_0004_turns_every_tree_gate_of_the_hybrid_backend(base_wheel: Path, patched_tree: Path, tmp_path: Path):
    """Every EAGLE-only tree gate (``self.topk > 1``) of the base's hybrid backend now reads ``tree_verify``."""
    unpack(base_wheel, tmp_path, only=[HYBRID])
    base = (tmp_path / HYBRID).read_text()
    patched = (patched_tree / HYBRID).read_text()
    gates = base.count("self.topk > 1:")
    assert gates == 3  # _forward_metadata, _capture_metadata, _replay_metadata
    assert patched.count("self.topk > 1:") == 0
    assert patched.count("self.tree_verify:") == gates
    assert 'getattr(model_runner.server_args, "speculative_ddtree_budget", None)' in patched


def test_0004_worker_and_memory_hooks_are_in_place(patched_tree: Path):
    worker = (patched_tree / WORKER).read_text()
    assert "does not support hybrid" not in worker  # 0001's blanket refusal is gone ...
    assert "check_ddtree_hybrid_backend(" in worker  # ... replaced by the backend check
    assert "path_steps_to_nodes(step, accepted_nodes)" in worker
    # the verify input (vendored spec-v1/ddtree_info.py) carries the tree to the kernels and the path to the commit
    info = (patched_tree / "sglang/srt/speculative/ddtree_info.py").read_text()
    assert "retrieve_next_token=vin.retrive_next_token.to(torch.int32)" in info
    assert "self.accepted_nodes = walk.accepted_nodes" in info
    mixin = (patched_tree / "sglang/srt/model_executor/model_runner_kv_cache_mixin.py").read_text()
    # the budget check runs before SGLang reserves the per-node intermediate states
    assert mixin.index("check_ddtree_hybrid_memory(") < mixin.index("mamba_state_intermediate_size = (")


def _call_keywords(tree: ast.AST, func: str) -> list[set[str]]:
    return [{k.arg for k in node.keywords} for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == func]


def test_harness_calls_the_kernels_as_the_backend_does(patched_tree: Path):
    """The harness passes the same keyword arguments as GDNAttnBackend.forward_extend (conv) and
    TritonGDNKernel.target_verify (GDN), so what is checked here is what the server runs."""
    harness_src = ast.parse(HARNESS.read_text())
    lin = patched_tree / "sglang/srt/layers/attention/linear"
    backend = ast.parse((lin / "gdn_backend.py").read_text())
    kernel = ast.parse((lin / "kernels/gdn_triton.py").read_text())
    conv_h = _call_keywords(harness_src, "causal_conv1d_update")
    conv_b = [kw for kw in _call_keywords(backend, "causal_conv1d_update") if "retrieve_next_token" in kw]
    assert len(conv_h) == 1 and len(conv_b) == 1 and conv_h[0] == conv_b[0]
    gdn_h = _call_keywords(harness_src, "fused_sigmoid_gating_delta_rule_update")
    gdn_b = [kw for kw in _call_keywords(kernel, "fused_sigmoid_gating_delta_rule_update")
             if "retrieve_parent_token" in kw]
    assert len(gdn_h) == 1 and len(gdn_b) == 1 and gdn_h[0] == gdn_b[0]


# ------------------------------------------------------------------------- 2. the base kernels on DDTree trees


def _cases(harness_mod) -> list:
    C = harness_mod.Case
    return [
        C(budget=1, batch=1),                                  # N1 = 2: shorter than the conv window
        C(budget=1, batch=3, kind="ties", kd=8, vd=8),
        C(budget=4, batch=3, kind="normal", heads=2, hv=2),    # H = HV
        C(budget=4, batch=1, kind="chain", bias=True),
        C(budget=4, batch=3, kind="ties", padded=True),        # CUDA-graph padding row (mamba index -1)
        C(budget=15, batch=3, kind="chain"),                   # a pure chain of 15: the deepest tree
        C(budget=15, batch=3, kind="normal", bias=True),
        C(budget=15, batch=1, kind="ties", heads=1, hv=2, kd=16, vd=8),
        C(budget=15, batch=3, kind="unused", kd=8, vd=8),     # at most 6 nodes: unused slots after them
    ]  # fp32 only: the Triton 3.6 interpreter multiplies two bf16 operands as raw bits (bf16 runs on the GPU)


# padding rows: the conv kernel skips them, so the GDN kernel reads uninitialised conv output there (as in SGLang)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("case", _cases(HARNESS_MOD), ids=lambda c: c.label())
def test_base_tree_kernels_match_float64_paths_and_commit(kern, harness, case):
    """SGLang's causal_conv1d_update + fused_sigmoid_gating_delta_rule_update (tree mode) on runtime-built DDTree
    trees: per-node outputs, conv windows and SSM states equal the float64 recurrence along each node's path and
    the runtime's torch references; the derived parents equal the tree's; after the walk, the fused scatter with
    path_steps_to_nodes commits exactly the accepted node's states, which equal the sequential recurrence over the
    accepted path and a chain verify of it; nothing else in the pools moves."""
    seed = SEED * 31 + zlib.crc32(case.label().encode())
    try:
        report = harness.run_round(kern, case, seed, torch.device("cpu"))
    except AssertionError as e:
        raise AssertionError(f"DDTREE_TEST_SEED={SEED} (case seed {seed}): {e}") from e
    assert report["gdn_state"] >= 0 and len(report["accept_len"]) == case.batch


def test_base_kernels_without_the_tree_arrays_get_ddtree_trees_wrong(kern, harness):
    """Control: a DDTree verify run through the chain path (what 0004 replaces) mixes siblings, so the per-node
    states differ from the path recurrence; the comparison above would catch a missing tree gate."""
    case = harness.Case(budget=4, batch=1, kind="normal")
    gen = torch.Generator().manual_seed(SEED)
    tree = harness.draft_tree(kern.rt, gen, case)
    while int((tree.parent[0, 1:int(tree.num_nodes[0])] != torch.arange(int(tree.num_nodes[0]) - 1)).sum()) == 0:
        tree = harness.draft_tree(kern.rt, gen, case)  # need a real branch, not a chain
    n1, d = case.n1, case.conv_dim
    lw = harness.make_layer(case, gen, "cpu")
    pools = harness.Pools(conv=torch.randn(1, 3, d, 3, generator=gen), ssm=torch.randn(1, 3, 2, 16, 16, generator=gen),
                          inter_conv=torch.zeros(1, 2, n1, d, 3), inter_ssm=torch.zeros(1, 2, n1, 2, 16, 16))
    before = pools.clone()
    mixed, a, b = torch.randn(n1, d, generator=gen), torch.randn(n1, 2, generator=gen), torch.randn(n1, 2, generator=gen)
    idx = torch.tensor([1], dtype=torch.int32)
    harness.verify_layer(kern, 0, lw, mixed, a, b, pools, idx, torch.arange(2, dtype=torch.int32), 1, n1, None)
    paths, lens = harness.paths_matrix(tree.parent, tree.num_nodes.long())
    _, win_ref = harness.conv_path_oracle(mixed.view(1, n1, d), paths, lens, before.conv[0][[1]], lw.conv_weights, None)
    n = int(tree.num_nodes[0])
    assert not torch.equal(pools.inter_conv[0, 0, :n], win_ref[0, :n].float())


# ------------------------------------------------------------------------------------- 3. the memory check


@pytest.fixture
def hybrid_mod(kern, runtime, monkeypatch):
    """ddtree_hybrid, with ``sglang.srt.speculative.ddtree`` resolving to the runtime vendored in the patched tree
    (what the overlay ships there), without importing sglang."""
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.ddtree", runtime)
    return kern.hybrid


def _fits(budget: int, total: int, per_node: int) -> bool:
    """The definition: budget + 1 nodes of per-node states plus the running requests' own states fit."""
    return (budget + 1) * per_node + per_node <= total


def test_memory_check_exact_boundary_on_random_sizes(hybrid_mod):
    gen = torch.Generator().manual_seed(SEED)
    checked = 0
    for _ in range(300):
        state = int(torch.randint(1, 400 << 20, (), generator=gen))  # bytes per request, all layers
        mrr = int(torch.randint(1, 300, (), generator=gen))
        per_node = state * mrr
        want = int(torch.randint(-1, 1030, (), generator=gen))  # target largest budget (-1: not even the root)
        total = per_node * (want + 2) + int(torch.randint(0, per_node, (), generator=gen))
        gib = total / 2**30  # exact: total < 2**53
        kw = dict(total_rest_gib=gib, state_bytes_per_req=state, max_running_requests=mrr)
        best = min(want, 1024)
        if best >= 1:
            assert hybrid_mod.check_ddtree_hybrid_memory(budget=best, **kw) == best
            assert _fits(best, total, per_node)
            assert best == 1024 or not _fits(best + 1, total, per_node)
            assert hybrid_mod.check_ddtree_hybrid_memory(budget=1, **kw) == best
        with pytest.raises(ValueError) as e:
            hybrid_mod.check_ddtree_hybrid_memory(budget=best + 1, **kw)
        msg = str(e.value)
        assert f"DDTree budget {best + 1} needs" in msg
        assert f"the largest budget that fits is {max(best, 0)}" in msg
        assert ("not even the root fits" in msg) == (best < 0)
        assert f"x {mrr} max running requests" in msg
        checked += 1
    assert checked == 300


def test_memory_check_qwen3_next_80b_numbers(hybrid_mod):
    """Qwen3-Next-80B-A3B at TP 1: 36 GatedDeltaNet layers, each a bf16 conv state (conv dim 2*16*128 + 32*128 =
    8192, K_conv - 1 = 3) and an fp32 SSM state (32 value heads x 128 x 128) = 2,146,304 B; x 36 = 73.688 MiB per
    request (SGLang's mamba_cache_per_req). 48 running requests, 60 GiB left after the weights: 3.454 GiB per
    tree node, 56.55 GiB for them after the requests' own states -> budget 15 (16 nodes) fits, 16 does not;
    budget 64 would need 65 x 3.454 = 224.52 GiB."""
    per_req = 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    assert per_req == 77_266_944
    kw = dict(total_rest_gib=60.0, state_bytes_per_req=per_req, max_running_requests=48)
    assert hybrid_mod.check_ddtree_hybrid_memory(budget=15, **kw) == 15
    with pytest.raises(ValueError) as e:
        hybrid_mod.check_ddtree_hybrid_memory(budget=64, **kw)
    msg = str(e.value)
    for part in ("DDTree budget 64 needs 224.52 GiB", "3537.000 MiB per node",
                 "73.688 MiB of conv + SSM state per request (all recurrent layers) x 48 max running requests",
                 "x 65 nodes", "but 56.55 GiB are available", "the largest budget that fits is 15.",
                 "Lower the budget or the max running requests"):
        assert part in msg, (part, msg)
    assert "not even the root fits" not in msg


def test_memory_check_not_even_the_root_fits(hybrid_mod):
    per_req = 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    with pytest.raises(ValueError) as e:  # 48 requests' states alone are 3.45 GiB; 4 GiB cannot hold a root too
        hybrid_mod.check_ddtree_hybrid_memory(budget=1, total_rest_gib=4.0, state_bytes_per_req=per_req,
                                              max_running_requests=48)
    assert "the largest budget that fits is 0 (not even the root fits)" in str(e.value)


# --------------------------------------------------------------------------------- 4. path_steps_to_nodes


@pytest.mark.parametrize("kind,budget,batch", [("normal", 15, 6), ("ties", 64, 5), ("chain", 20, 3),
                                               ("unused", 15, 4), ("normal", 1, 7)])
def test_path_steps_to_nodes_on_random_walks(kern, harness, kind, budget, batch):
    gen = torch.Generator().manual_seed(SEED + budget)
    case = harness.Case(budget=budget, batch=batch, kind=kind)
    for _ in range(5):
        tree = harness.draft_tree(kern.rt, gen, case)
        walk = kern.rt.accept_walk(tree, harness.planted_targets(tree, gen), impl="torch")
        acc, al = walk.accepted_nodes, walk.accept_len.long()
        assert acc.dtype == torch.int32
        # the commit's steps (commit_lens - 1), random steps along the path, and negative "skip" markers
        steps = torch.stack([al, (torch.rand(batch, generator=gen) * (al + 1)).long(),
                             -torch.randint(1, 4, (batch,), generator=gen)])
        for row in steps:
            for s in (row, row.to(torch.int32)):
                got = kern.hybrid.path_steps_to_nodes(s, acc)
                want = [int(acc[b, int(s[b])]) if int(s[b]) >= 0 else int(s[b]) for b in range(batch)]
                assert got.dtype == torch.int64 and got.tolist() == want
        last = kern.hybrid.path_steps_to_nodes(al, acc)
        for b in range(batch):  # the commit's node is the end of the accepted path, reached through parents
            path, node = [], int(last[b])
            while node >= 0:
                path.append(node)
                node = int(tree.parent[b, node])
            assert path[::-1] == acc[b, :int(al[b]) + 1].tolist()


# -------------------------------------------------------------- 5. the backend check, on the real classes

BACKEND_SCRIPT = textwrap.dedent('''
    import json
    from types import SimpleNamespace
    import torch
    from sglang.srt.speculative.ddtree_hybrid import check_ddtree_hybrid_backend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
        HybridLinearAttnBackend, Mamba2AttnBackend, MambaAttnBackendBase)
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import FlashInferGDNKernel
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    def runner(**server_args):
        conv = SimpleNamespace(conv=[torch.zeros(9, 64, 3)])
        pool = SimpleNamespace(size=8, mamba_pool=SimpleNamespace(mamba_cache=conv),
                               get_mamba_indices=lambda rpi: rpi.to(torch.int32) + 1)
        args = SimpleNamespace(**{"speculative_eagle_topk": None, **server_args})
        return SimpleNamespace(device="cpu", server_args=args, req_to_token_pool=pool)

    def bare(cls, **server_args):  # an instance whose __init__ needs a GPU model runner: the base part only
        obj = object.__new__(cls)
        MambaAttnBackendBase.__init__(obj, runner(**server_args))
        return obj

    def hybrid(linear):
        return HybridLinearAttnBackend(object.__new__(TritonAttnBackend), linear, [3, 7])

    out = {}
    def case(name, fn):
        try:
            out[name] = {"ok": True, "value": fn()}
        except Exception as e:
            out[name] = {"ok": False, "type": type(e).__name__, "msg": str(e)}

    for name, kw in {"ddtree": dict(speculative_ddtree_budget=15), "chain": dict(speculative_ddtree_budget=None),
                     "eagle_tree": dict(speculative_eagle_topk=4), "eagle_chain": dict(speculative_eagle_topk=1),
                     "no_flag": {}}.items():
        case("tree_verify_" + name, lambda kw=kw: bare(GDNAttnBackend, **kw).tree_verify)

    gdn = GDNAttnBackend(runner(speculative_ddtree_budget=15))  # the real __init__ (triton kernels on CPU)
    case("verify_kernel", lambda: type(gdn.kernel_dispatcher.verify_kernel).__name__)
    case("plain", lambda: check_ddtree_hybrid_backend(object.__new__(TritonAttnBackend)))
    case("gdn_triton", lambda: check_ddtree_hybrid_backend(hybrid(gdn)))
    case("gdn_budget_128", lambda: check_ddtree_hybrid_backend(hybrid(gdn), budget=128))
    case("gdn_budget_129", lambda: check_ddtree_hybrid_backend(hybrid(gdn), budget=129))
    case("mamba2", lambda: check_ddtree_hybrid_backend(hybrid(bare(Mamba2AttnBackend, speculative_ddtree_budget=15))))
    case("no_linear", lambda: check_ddtree_hybrid_backend(object.__new__(HybridLinearAttnBackend)))
    no_tree = GDNAttnBackend(runner(speculative_ddtree_budget=None))
    case("gdn_without_tree_verify", lambda: check_ddtree_hybrid_backend(hybrid(no_tree)))
    fi = GDNAttnBackend(runner(speculative_ddtree_budget=15))
    fi.kernel_dispatcher.verify_kernel = object.__new__(FlashInferGDNKernel)  # its constructor path needs CUDA
    case("gdn_flashinfer", lambda: check_ddtree_hybrid_backend(hybrid(fi)))

    n1, bs = 5, 2
    rnt = torch.tensor([[1, 3, -1, -1, -1], [1, -1, -1, -1, -1]], dtype=torch.int32)
    rns = torch.tensor([[-1, 2, 4, -1, -1], [-1, -1, -1, -1, -1]], dtype=torch.int32)
    def batch(spec):
        return SimpleNamespace(batch_size=bs, req_pool_indices=torch.tensor([2, 5]), input_ids=torch.zeros(bs * n1,
                               dtype=torch.long), forward_mode=ForwardMode.TARGET_VERIFY, mamba_track_mask=None,
                               spec_info=spec)
    def metadata(spec):
        gdn.init_forward_metadata(batch(spec))
        m = gdn.forward_metadata
        return {"same_next": m.retrieve_next_token is rnt, "same_sibling": m.retrieve_next_sibling is rns,
                "parent": None if m.retrieve_parent_token is None else
                [list(m.retrieve_parent_token.shape), str(m.retrieve_parent_token.dtype)],
                "qsl": m.query_start_loc.tolist(), "cache": m.mamba_cache_indices.tolist()}
    case("metadata_ddtree", lambda: metadata(DDTreeVerifyInput(draft_token=None, positions=None, draft_token_num=n1,
                                                               retrieve_next_token=rnt, retrieve_next_sibling=rns)))
    # ModelRunner._dummy_run (FlashInfer autotune) builds exactly this spec input for a TARGET_VERIFY warm-up
    case("metadata_dummy_run", lambda: metadata(DFlashVerifyInput(draft_token=None, positions=None,
                                                                  draft_token_num=n1, custom_mask=None)))
    print("RESULT" + json.dumps(out))
''')


@pytest.fixture(scope="module")
def backend_results(patched_tree: Path, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("hybrid_backend")
    env = sglang_subprocess_env(patched_tree, d)
    r = subprocess.run([sys.executable, "-c", BACKEND_SCRIPT], capture_output=True, text=True, env=env,
                       timeout=600, cwd=d)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        missing = [ln for ln in r.stderr.splitlines() if "No module named" in ln]
        msg = f"the patched hybrid backend does not import here: {(missing or r.stderr.splitlines() or ['?'])[-1]}"
        if not missing:
            pytest.fail(msg + "\n" + r.stderr[-3000:])
        name = missing[-1].split("No module named", 1)[1].strip(" '\"").split(".")[0]
        listed = (REPO / "tests" / "sglang_v1" / "requirements-cpu.txt").read_text()
        unlisted = name in EXTRA_DEPS and f"{name}==" not in listed
        if os.environ.get("DDTREE_REQUIRE_SGLANG_DEPS") == "1" and not unlisted:
            pytest.fail(msg + "\n" + r.stderr[-3000:])
        pytest.skip(msg + (f" (add {' '.join(EXTRA_DEPS.values())} to tests/sglang_v1/requirements-cpu.txt)"
                           if unlisted else ""))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("name,want", [("ddtree", True), ("chain", False), ("eagle_tree", True),
                                       ("eagle_chain", False), ("no_flag", False)])
def test_tree_verify_flag_of_the_real_backend(backend_results, name, want):
    r = backend_results["tree_verify_" + name]
    assert r == {"ok": True, "value": want}


def test_backend_check_accepts_attention_only_and_gdn_triton(backend_results):
    assert backend_results["plain"] == {"ok": True, "value": None}
    assert backend_results["verify_kernel"] == {"ok": True, "value": "TritonGDNKernel"}
    assert backend_results["gdn_triton"] == {"ok": True, "value": "GDNAttnBackend"}
    assert backend_results["gdn_budget_128"] == {"ok": True, "value": "GDNAttnBackend"}


@pytest.mark.parametrize("name,kind,needles", [
    ("mamba2", "ValueError", ["GatedDeltaNet layers (GDNAttnBackend) only", "backend is Mamba2AttnBackend",
                              "drop --speculative-ddtree-budget"]),
    ("gdn_flashinfer", "ValueError", ["verify kernel is FlashInferGDNKernel", "--linear-attn-backend triton",
                                      "--linear-attn-decode-backend", "--linear-attn-prefill-backend"]),
    ("no_linear", "ValueError", ["HybridLinearAttnBackend has no linear_attn_backend"]),
    ("gdn_without_tree_verify", "RuntimeError", ["tree_verify is False"]),
    ("gdn_budget_129", "ValueError", ["budget 129 is too large for a hybrid target", "--speculative-ddtree-budget <= 128"]),
])
def test_backend_check_refuses_clearly(backend_results, name, kind, needles):
    r = backend_results[name]
    assert not r["ok"] and r["type"] == kind, r
    for n in needles:
        assert n in r["msg"], (n, r["msg"])


def test_forward_metadata_hands_the_ddtree_tree_to_the_kernels(backend_results):
    r = backend_results["metadata_ddtree"]
    assert r["ok"], r
    v = r["value"]
    assert v["same_next"] and v["same_sibling"]  # DDTreeVerifyInput's arrays reach the kernels unchanged
    assert v["parent"] == [[2, 5], "torch.int32"]  # the buffer the conv kernel writes and the GDN kernel reads
    assert v["qsl"] == [0, 5, 10] and v["cache"] == [3, 6]


def test_forward_metadata_of_the_dummy_run_warm_up(backend_results):
    """ModelRunner._dummy_run (the FlashInfer-autotune warm-up; on by default for Qwen3-Next on SM100, whose MoE
    runner defaults to flashinfer_trtllm) runs a TARGET_VERIFY forward with a plain DFlashVerifyInput, which has no
    tree arrays: with tree_verify on, the hybrid backend must run it as a chain, not raise AttributeError."""
    r = backend_results["metadata_dummy_run"]
    assert r["ok"], r
    assert r["value"]["parent"] is None and not r["value"]["same_next"]
    assert r["value"]["qsl"] == [0, 5, 10]
