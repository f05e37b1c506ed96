"""bench.e2e.round_share on a real torch-profiler trace (CPU) with GPU activity injected at known launches.

The CPU run gives the real chrome-trace format (python_function frames, cpu_op events); a fake package with the
SGLang/DDTree file and function names runs one prefill and three decode rounds, each step calling one distinctive
aten op. For every such op we add a `cudaLaunchKernel` inside it and a GPU kernel with that correlation whose
duration encodes the step (the op tells the test which step launched it, independently of the Python stack that
round_share.py reads), so every per-round number it reports is known exactly.
"""
from __future__ import annotations

import gzip
import importlib
import json
import sys
import textwrap

import pytest
import torch

from bench.e2e import round_share

FILES = {
    "sglang/srt/speculative/ddtree/tree.py": "def build_tree(x):\n    return torch.cumsum(x, 0)\n",
    "sglang/srt/speculative/ddtree/verify.py": "def build_verify_inputs(x):\n    return torch.tril(x)\n",
    "sglang/srt/speculative/ddtree/walk.py": "def accept_walk(x):\n    return torch.argmax(x)\n",
    "sglang/srt/speculative/ddtree_verify.py": """
        def ddtree_draft_topk(x):
            return torch.topk(x, 2, dim=0).values
        def build_ddtree_verify_mask(x):
            return torch.flip(x, [0])
        def sample_target_tokens_per_node(x):
            return torch.exp(x)
        def accepted_kv_and_hidden_index(x):
            return torch.sign(x)
        """,
    "sglang/srt/speculative/dflash_info.py": """
        from sglang.srt.speculative import ddtree_verify as dv
        from sglang.srt.speculative.ddtree import walk
        def prepare_for_verify(x):
            torch.abs(x)
            return dv.build_ddtree_verify_mask(x)
        def verify(x):
            dv.sample_target_tokens_per_node(x)
            walk.accept_walk(x)
            dv.accepted_kv_and_hidden_index(x)
            return torch.neg(x)
        """,
    "sglang/srt/model_executor/model_runner.py": """
        def forward(x, draft):
            return torch.sin(x) if draft else torch.cos(x)
        """,
    "sglang/srt/managers/tp_worker.py": """
        from sglang.srt.model_executor import model_runner
        def forward_batch_generation(x, prefill=False):
            if prefill:
                torch.floor(x)
            return model_runner.forward(x, False)
        """,
    "sglang/srt/speculative/dflash_worker.py": """
        from sglang.srt.managers import tp_worker
        from sglang.srt.model_executor import model_runner
        from sglang.srt.speculative import dflash_info, ddtree_verify as dv
        from sglang.srt.speculative.ddtree import tree, verify as tv
        def _prepare_ddtree_verify(x):
            torch.sqrt(x)
            dv.ddtree_draft_topk(x)
            tree.build_tree(x)
            tv.build_verify_inputs(x)
            return dflash_info.prepare_for_verify(x)
        def _prepare_for_speculative_decoding(x):
            model_runner.forward(x, True)
            return _prepare_ddtree_verify(x)
        def _append_target_hidden_to_draft_kv(x):
            return torch.log1p(x)
        def forward_batch_generation(x, prefill=False):
            if prefill:
                return tp_worker.forward_batch_generation(x, prefill=True)
            _prepare_for_speculative_decoding(x)
            tp_worker.forward_batch_generation(x)
            dflash_info.verify(x)
            _append_target_hidden_to_draft_kv(x)
            return torch.ceil(x)
        """,
}

def vendored_layout(files: dict) -> dict:
    """The same 0.5.11 round as the overlay lays it out since its DDTree modules are vendored (patches/ddtree/spec-v1/):
    the verify input's methods and the worker's step that builds it in ddtree_info.py, which the worker calls. FILES
    is the layout the recorded traces have (the verify input inside dflash_info.py, the step a method of the worker);
    both must classify alike."""
    info, worker = "sglang/srt/speculative/dflash_info.py", "sglang/srt/speculative/dflash_worker.py"
    w = textwrap.dedent(files[worker])
    step = w[w.index("def _prepare_ddtree_verify"):w.index("def _prepare_for_speculative_decoding")]
    out = {k: v for k, v in files.items() if k not in (info, worker)}
    out["sglang/srt/speculative/ddtree_info.py"] = (
        textwrap.dedent(files[info]) + "from sglang.srt.speculative.ddtree import tree, verify as tv\n"
        + step.replace("def _prepare_ddtree_verify", "def prepare_ddtree_verify")
        .replace("dflash_info.prepare_for_verify", "prepare_for_verify"))
    out[worker] = (w.replace(step, "").replace("dflash_info, ddtree_verify as dv", "ddtree_info")
                   .replace("return _prepare_ddtree_verify(x)", "return ddtree_info.prepare_ddtree_verify(x)")
                   .replace("dflash_info.verify(x)", "ddtree_info.verify(x)"))
    assert "dflash_info" not in "".join(out.values()) and "_prepare_ddtree_verify" not in "".join(out.values())
    return out


# leaf aten op -> (category, kernel name, duration us, kernels per launch)
OPS = {
    "aten::topk": ("draft_topk", "_chunk_topk_kernel", 3.0, 1),
    "aten::cumsum": ("build_tree", "_build_tree_kernel", 5.0, 1),
    "aten::tril": ("verify_inputs", "_verify_kernel", 7.0, 1),
    "aten::flip": ("mask", "_ddtree_expand_mask_kernel", 11.0, 1),
    "aten::exp": ("sampling", "void at::native::exp_kernel", 13.0, 1),
    "aten::argmax": ("walk", "_walk_kernel", 17.0, 1),
    "aten::sign": ("kv_compaction", "_compaction_kernel", 19.0, 1),
    "aten::abs": ("verify_prepare_other", "void at::native::abs_kernel", 23.0, 1),
    "aten::neg": ("verify_commit_other", "void at::native::neg_kernel", 29.0, 1),
    "aten::sqrt": ("ddtree_glue", "void at::native::sqrt_kernel", 31.0, 1),
    "aten::sin": ("draft_forward", "void at::native::sin_kernel", 37.0, 1),
    "aten::cos": ("target_forward", "void gemm_graph_node", 41.0, 3),  # a replayed graph: 3 kernels, 1 launch
    "aten::log1p": ("draft_kv_append", "void at::native::log1p_kernel", 43.0, 1),
    "aten::ceil": ("round_other", "void at::native::ceil_kernel", 47.0, 1),
    "aten::floor": ("prefill", "void at::native::floor_kernel", 53.0, 1),
}
ROUNDS = 3


# The spec-v2 worker of 0.5.17 on a hybrid target (names as in the patched tree: dflash_worker_v2.py's inline decode
# round, ddtree_v2/round.py, the GDN layers' tree verify in ddtree_v2/hybrid.py, the commit through the worker).
FILES_V2 = {
    "sglang/srt/speculative/ddtree/tree.py": "def build_tree(x):\n    return torch.cumsum(x, 0)\n",
    "sglang/srt/speculative/ddtree/walk.py": "def accept_walk(x):\n    return torch.argmax(x)\n",
    "sglang/srt/speculative/ddtree/tree_recurrent_triton.py": """
        def tree_gated_delta_rule(x):
            return torch.erf(x)
        def commit_tree_states_layers(x):
            return torch.erfc(x)
        """,
    "sglang/srt/speculative/ddtree_v2/draft_topk.py": "def draft_topk(x):\n    return torch.topk(x, 2, dim=0).values\n",
    "sglang/srt/speculative/ddtree_v2/sampling.py": "def target_tokens(x):\n    return torch.exp(x)\n",
    "sglang/srt/speculative/ddtree_v2/hybrid.py": """
        from sglang.srt.speculative.ddtree import tree_recurrent_triton as tr
        class TreeVerify:
            def forward(self, x):
                return tr.tree_gated_delta_rule(x)
        def commit(x):
            return tr.commit_tree_states_layers(x)
        """,
    "sglang/srt/layers/attention/linear/gdn_backend.py": """
        from sglang.srt.speculative.ddtree_v2 import hybrid
        def forward_extend(x):
            return hybrid.TreeVerify().forward(x)
        """,
    "sglang/srt/model_executor/model_runner.py": """
        from sglang.srt.layers.attention.linear import gdn_backend
        def forward(x, draft):
            if draft:
                return torch.sin(x)
            gdn_backend.forward_extend(x)
            return torch.cos(x)
        """,
    "sglang/srt/managers/tp_worker.py": """
        from sglang.srt.model_executor import model_runner
        def forward_batch_generation(x, prefill=False):
            if prefill:
                torch.floor(x)
                return None
            return model_runner.forward(x, False)
        """,
    "sglang/srt/speculative/ddtree_v2/round.py": """
        from sglang.srt.managers import tp_worker
        from sglang.srt.speculative.ddtree import tree, walk
        from sglang.srt.speculative.ddtree_v2 import draft_topk, sampling
        def verify_mask(x):
            return torch.flip(x, [0])
        def _finish_round(worker, x):
            draft_topk.draft_topk(x)
            tree.build_tree(x)
            verify_mask(x)
            torch.sqrt(x)
            tp_worker.forward_batch_generation(x)
            sampling.target_tokens(x)
            walk.accept_walk(x)
            return worker._update_target_mamba_state_after_verify(x)
        def finish_round(worker, x):
            return _finish_round(worker, x)
        """,
    "sglang/srt/speculative/dflash_worker_v2.py": """
        import sys
        from sglang.srt.managers import tp_worker
        from sglang.srt.model_executor import model_runner
        from sglang.srt.speculative.ddtree_v2 import hybrid, round as ddround
        def _ensure_draft_block_buffers(bs):
            return bs
        def _update_target_mamba_state_after_verify(x):
            return hybrid.commit(x)
        def forward_batch_generation(x, prefill=False):
            if prefill:
                return tp_worker.forward_batch_generation(x, prefill=True)
            _ensure_draft_block_buffers(4)
            model_runner.forward(x, True)
            ddround.finish_round(sys.modules[__name__], x)
            return torch.ceil(x)
        """,
}
OPS_V2 = {
    "aten::topk": ("draft_topk", "_chunk_topk_kernel", 3.0, 1),
    "aten::cumsum": ("build_tree", "_build_tree_kernel", 5.0, 1),
    "aten::flip": ("mask", "_ddtree_expand_mask_kernel", 11.0, 1),
    "aten::exp": ("sampling", "void at::native::exp_kernel", 13.0, 1),
    "aten::argmax": ("walk", "_walk_kernel", 17.0, 1),
    "aten::sqrt": ("ddtree_glue", "void at::native::sqrt_kernel", 31.0, 1),
    "aten::sin": ("draft_forward", "void at::native::sin_kernel", 37.0, 1),
    "aten::cos": ("target_forward", "void gemm_graph_node", 41.0, 3),
    "aten::erf": ("gdn_tree_verify", "_tree_gdn_kernel", 59.0, 1),
    "aten::erfc": ("hybrid_commit", "_commit_kernel", 61.0, 1),
    "aten::ceil": ("round_other", "void at::native::ceil_kernel", 47.0, 1),
    "aten::floor": ("prefill", "void at::native::floor_kernel", 53.0, 1),
}


def _inject(events: list[dict], ops_table: dict | None = None) -> list[dict]:
    """Add a launch inside every (outermost) step op and its GPU kernel(s), in the trace's own format."""
    OPS = ops_table or globals()["OPS"]  # noqa: N806 - the table in use
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("name") in OPS), key=lambda e: e["ts"])
    outer = [e for e in ops if not any(o is not e and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
                                        and o["tid"] == e["tid"] for o in ops)]
    out, corr, gpu_t = list(events), 10_000, max(e["ts"] + e.get("dur", 0) for e in events)
    for op in outer:
        _, kname, dur, count = OPS[op["name"]]
        corr += 1
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch" if count > 1 else "cudaLaunchKernel",
                    "pid": op["pid"], "tid": op["tid"], "ts": op["ts"] + op["dur"] / 2, "dur": 0.01,
                    "args": {"correlation": corr, "External id": corr}})
        for _ in range(count):
            out.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": gpu_t, "dur": dur,
                        "args": {"correlation": corr, "device": 0, "stream": 7}})
            gpu_t += dur + 1.0
    return out


def _profiled(tmp_path_factory, files: dict, worker_module: str, ops_table: dict) -> list[dict]:
    """One prefill and ROUNDS decode rounds of the fake package's worker under the torch profiler, GPU injected."""
    root = tmp_path_factory.mktemp("fakepkg")
    for rel, src in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("import torch\n" + textwrap.dedent(src))
    for d in [p for p in root.rglob("*") if p.is_dir()]:
        (d / "__init__.py").touch()
    sys.path.insert(0, str(root))
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    try:
        worker = importlib.import_module(worker_module)
        x = torch.randn(4, 4)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
            worker.forward_batch_generation(x, prefill=True)
            for _ in range(ROUNDS):
                worker.forward_batch_generation(x)
        out = root / "trace.json"
        prof.export_chrome_trace(str(out))
    finally:
        sys.path.remove(str(root))
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return _inject(json.loads(out.read_text())["traceEvents"], ops_table)


@pytest.fixture(scope="module", params=["vendored", "recorded"])
def trace(request, tmp_path_factory) -> list[dict]:
    """A 0.5.11 round as the overlay lays it out now (spec-v1 vendored) and as the committed traces recorded it."""
    files = vendored_layout(FILES) if request.param == "vendored" else FILES
    return _profiled(tmp_path_factory, files, "sglang.srt.speculative.dflash_worker", OPS)


@pytest.fixture(scope="module")
def trace_v2(tmp_path_factory) -> list[dict]:
    return _profiled(tmp_path_factory, FILES_V2, "sglang.srt.speculative.dflash_worker_v2", OPS_V2)


def test_spec_v2_hybrid_rounds_are_found_and_split(trace_v2):
    """0.5.17's worker has no _prepare_for_speculative_decoding (what spec-v1 rounds are found by): its decode round
    is inline in forward_batch_generation. Every round is found, the drafter's forward is told from the target's,
    and a hybrid target's GDN tree verify and state commit get their own categories."""
    a = round_share.analyse(trace_v2)
    assert a["method"] == "python-stacks" and a["rounds"] == ROUNDS, a.get("error")
    want = {cat: dur * count for cat, _, dur, count in OPS_V2.values() if cat != "prefill"}
    got = {c: v["gpu_us_per_round"] for c, v in a["categories"].items() if v["gpu_us_per_round"]}
    assert got == pytest.approx(want)
    assert a["ddtree_all"]["gpu_us_per_round"] == pytest.approx(
        sum(want[c] for c in round_share.DDTREE_ALL if c in want))


def test_trace_has_the_real_format(trace):
    cats = {e.get("cat") for e in trace}
    assert {"python_function", "cpu_op", "cuda_runtime", "kernel"} <= cats
    frames = [e["name"] for e in trace if e.get("cat") == "python_function"]
    assert any(round_share.split_frame(n) == (n.split("(")[0], "forward_batch_generation") for n in frames)


def test_per_round_gpu_time_by_step(trace):
    a = round_share.analyse(trace)
    assert a["method"] == "python-stacks"
    assert a["rounds"] == ROUNDS  # the prefill call does not draft, so it is no round
    want = {cat: dur * count for cat, _, dur, count in OPS.values() if cat != "prefill"}
    got = {c: v["gpu_us_per_round"] for c, v in a["categories"].items() if v["gpu_us_per_round"]}
    assert got == pytest.approx(want)
    core = sum(want[c] for c in round_share.DDTREE_CORE)
    assert a["ddtree_core"]["gpu_us_per_round"] == pytest.approx(core)
    assert a["ddtree_core"]["share_of_round_gpu"] == pytest.approx(core / sum(want.values()), abs=1e-4)
    assert a["gpu_us_per_round"]["kernel_sum_median"] == pytest.approx(sum(want.values()))
    assert a["categories"]["target_forward"]["top_kernels_us_per_round"] == {"void gemm_graph_node": 123.0}


def test_host_time_partitions_the_round(trace):
    a = round_share.analyse(trace)
    shares = [v["share_of_round_host"] for v in a["categories"].values()]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    for c in round_share.DDTREE_CORE:
        assert a["categories"][c]["host_us_per_round_profiled"] > 0
    host = sum(v["host_us_per_round_profiled"] for v in a["categories"].values())
    assert host == pytest.approx(a["wall_us_per_round_profiled"]["mean"], rel=0.01)


def test_fallback_by_kernel_names(trace):
    no_frames = [e for e in trace if e.get("cat") != "python_function"]
    a = round_share.analyse(no_frames)
    assert a["method"].startswith("kernel-names")
    assert a["rounds"] == ROUNDS - 1  # the last marker's round runs to the trace end and is dropped
    assert a["categories"]["build_tree"]["gpu_us_per_round"] == pytest.approx(5.0)
    assert a["categories"]["walk"]["gpu_us_per_round"] == pytest.approx(17.0)


def test_run_on_a_result_folder(trace, tmp_path):
    d = tmp_path / "prof" / "agree-ddtree-b64-graph-prof-bs1"
    d.mkdir(parents=True)
    with gzip.open(d / "1.0-TP-0.trace.json.gz", "wt") as fh:
        json.dump({"traceEvents": trace}, fh)
    meta = [{"spec_verify_ct": 40}]
    res = {"config": {"name": "agree-ddtree-b64-graph-prof"},
           "workloads": {"speed-bs1": [{"seconds": s, "meta": meta} for s in (0.2, 0.4, 0.3)],
                         "profile": {"bs1": {"seconds": 1.5, "meta": [{"spec_verify_ct": 8}]}}}}
    (tmp_path / "agree-ddtree-b64-graph-prof.json").write_text(json.dumps(res))
    out = round_share.run(tmp_path)["traces"]["agree-ddtree-b64-graph-prof-bs1"]
    assert out["rounds"] == ROUNDS
    assert out["wall_us_per_round_unprofiled"] == pytest.approx(0.3e6 / 40)
    core = out["ddtree_core"]["gpu_us_per_round"]
    assert out["ddtree_core"]["gpu_share_of_unprofiled_wall"] == pytest.approx(core / (0.3e6 / 40), abs=1e-4)
    assert out["profiled_call"] == {"seconds": 1.5, "verify_rounds": 8}
