"""The shared spec-v2 glue against each base's own classes, on CPU: the calls whose keywords or homes moved between
0.5.14 and 0.5.17 (next draft input, cache-location kernel, result type), the verify-mask buffer each base's triton
backend captures its graph with, the tensor-parallel size, and the base-specific lines of the series."""
from __future__ import annotations

import json
from pathlib import Path

from v2_helpers import TRAITS, run_python

SCRIPT = r'''
import json, types
import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.ddtree_v2 import compat, round as ddround

out = {}
def bare_worker(**attrs):
    """The base's real worker class without its GPU start-up; unknown attributes fall through to a target worker
    that has none (as the class's __getattr__ delegates)."""
    w = object.__new__(DFlashWorkerV2)
    w._target_worker = types.SimpleNamespace()
    for k, v in attrs.items():
        setattr(w, k, v)
    return w


worker = bare_worker()
bonus = torch.tensor([5, 7, 9])
new_lens = torch.tensor([11, 12, 13])
reserved = torch.tensor([40, 41, 42], dtype=torch.int32)
nxt = compat.next_draft_input_decode(worker, draft_input=types.SimpleNamespace(reserved_seq_lens_cpu=reserved),
                                     bonus_tokens=bonus, new_seq_lens=new_lens)
tok = getattr(nxt, "bonus_tokens", None)
if tok is None:
    tok = nxt.verified_id
out["next"] = {"type": type(nxt).__name__, "tokens": tok.tolist(), "new_seq_lens": nxt.new_seq_lens.tolist(),
               "watermark": (nxt.cur_allocated_seq_lens_cpu.tolist()
                             if getattr(nxt, "cur_allocated_seq_lens_cpu", None) is not None else None),
               "verify_done": getattr(nxt, "verify_done", None) is not None,
               "has_verify_done_field": hasattr(nxt, "verify_done")}
out["names"] = {n: compat.base_name(n).__module__ for n in ("assign_extend_cache_locs_func", "GenerationBatchResult",
                                                             "apply_dflash_verify_logits_adjustments")}

backend = object.__new__(TritonAttnBackend)
backend._verify_mask = None  # 0.5.17's property reads it; older bases have no such attribute
backend.cuda_graph_custom_mask = torch.zeros(4096, dtype=torch.uint8)
rnd = object.__new__(ddround.DDTreeRound)
m = rnd.verify_mask(backend, 2, 1000, "cpu")
big = rnd.verify_mask(backend, 2, 5000, "cpu")
out["mask"] = {"in_graph_buffer": m.data_ptr() == backend.cuda_graph_custom_mask.data_ptr(), "numel": m.numel(),
               "too_big_in_buffer": big.data_ptr() == backend.cuda_graph_custom_mask.data_ptr(),
               "has_verify_mask": hasattr(TritonAttnBackend, "verify_mask")}
other = types.SimpleNamespace(cuda_graph_custom_mask=backend.cuda_graph_custom_mask)  # not a triton backend
out["mask"]["other_backend_in_buffer"] = (
    rnd.verify_mask(other, 2, 1000, "cpu").data_ptr() == backend.cuda_graph_custom_mask.data_ptr())

w = bare_worker(server_args=types.SimpleNamespace(tp_size=2))
with_ps = bare_worker(ps=types.SimpleNamespace(tp_size=4), server_args=types.SimpleNamespace(tp_size=1))
out["tp"] = [ddround.tp_size(w), ddround.tp_size(with_ps)]
print("RESULT" + json.dumps(out))
'''


def test_glue_against_the_base_classes(v2_base: str, v2_tree: Path, tmp_path: Path):
    r = run_python(v2_tree, tmp_path, SCRIPT)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    res = json.loads(line[len("RESULT"):])
    nxt = res["next"]
    assert nxt["type"] == "DFlashDraftInputV2" and nxt["tokens"] == [5, 7, 9] and nxt["new_seq_lens"] == [11, 12, 13]
    if v2_base == "0.5.14":
        # verified_id, the reservation carried as the next allocation watermark, a recorded verify-done event
        assert nxt["watermark"] == [40, 41, 42] and nxt["verify_done"], nxt
    else:
        assert nxt["watermark"] is None and not nxt["has_verify_done_field"], nxt
    assert all(mod.startswith("sglang.") for mod in res["names"].values()), res["names"]
    mask = res["mask"]
    if mask["has_verify_mask"]:  # 0.5.17: its VerifyMask object; the old flat buffer is never taken
        assert not mask["in_graph_buffer"] and mask["numel"] == 1000
    else:  # 0.5.14-0.5.16: written straight into the buffer the target graph was captured with
        assert mask["in_graph_buffer"] and mask["numel"] == 1000
    assert not mask["too_big_in_buffer"] and not mask["other_backend_in_buffer"]
    assert res["tp"] == [2, 4]


def test_base_specific_lines_of_the_series(v2_base: str, v2_tree: Path):
    """What each base needs beyond the 0.5.17 series, in the patched files (the behaviour is above and in
    test_v2_server_args)."""
    traits = TRAITS[v2_base]
    prep = (v2_tree / "sglang/srt/speculative/dflash_info_v2.py").read_text()
    assert "committed_len + reserve_ahead" in prep
    if "planning_len" in prep:  # 0.5.14: the host planning bound is committed + one drafter block under DDTree
        assert "planning_len = committed_len + plan_ahead" in prep and "plan_ahead = int(dflash_block)" in prep
    hook = (v2_tree / "sglang/srt/arg_groups/speculative_hook.py").read_text()
    assert ("grammar_in_worker=False" in hook) == (not traits.grammar)
    runner = (v2_tree / "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py").read_text()
    assert "build_custom_mask = True" in runner
    triton = (v2_tree / "sglang/srt/layers/attention/triton_backend.py").read_text()
    assert "spec_info.custom_mask.data_ptr() != custom_mask.data_ptr()" in triton
