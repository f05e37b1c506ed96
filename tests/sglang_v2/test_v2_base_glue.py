"""The shared spec-v2 glue against each base's own classes, on CPU: the calls whose keywords or homes moved between
0.5.14 and 0.5.17 (next draft input, cache-location kernel, result type), the verify-mask buffer each base's triton
backend captures its graph with, the tensor-parallel size, and the base-specific lines of the series."""
from __future__ import annotations

import json
from pathlib import Path

from v2_helpers import TRAITS


def test_glue_against_the_base_classes(v2_base: str, v2_probe: dict):
    """v2_helpers.PROBE_SCRIPT, run in the patched tree of each base."""
    res = v2_probe
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
    assert "committed_len + reserve_ahead" in prep or ("reserve = kv_reservation(" in prep and "reserve=reserve" in prep)
    if "planning_len" in prep:  # 0.5.14: the host planning bound is committed + one drafter block under DDTree
        assert "planning_len = committed_len + plan_ahead" in prep and "plan_ahead = int(dflash_block)" in prep
    # argument resolution is hooked, not patched: around _handle_dflash, whose post_resolve takes the base's grammar
    # trait from bases.py (0.5.14-0.5.16: grammar_in_worker=False; the behaviour: test_v2_server_args)
    assert "ddtree" not in (v2_tree / "sglang/srt/arg_groups/speculative_hook.py").read_text()
    table = json.loads((v2_tree / "sglang/srt/speculative/ddtree_v2/plugin_hooks.json").read_text())
    assert ("sglang.srt.arg_groups.speculative_hook._handle_dflash", "around") in {
        (h["target"], h["type"]) for h in table["hooks"]}
    assert isinstance(traits.grammar, bool)
    runner = (v2_tree / "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py").read_text()
    assert "build_custom_mask = True" in runner
    triton = (v2_tree / "sglang/srt/layers/attention/triton_backend.py").read_text()
    assert "spec_info.custom_mask.data_ptr() != custom_mask.data_ptr()" in triton
