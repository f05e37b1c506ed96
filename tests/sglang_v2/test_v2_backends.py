"""The verify metadata a mask-reading backend gets from a DDTree verify input, on the real patched SGLang, on CPU.

FlashInfer (wired, refused by default as not proven on a GPU here) plans TARGET_VERIFY from
`DFlashVerifyInput.generate_attn_arg_prefill`: query offsets of width N1, KV indices of each request's context
plus its N1 verify slots, and the flat custom mask, which for FlashInfer must mark the context columns visible
(`prefix_cols=True`). The triton backend's layout (tree block only) is covered by tests/runtime/test_mask.py and
was proven on the H200.
"""
from __future__ import annotations

from v2_helpers import TRAITS, script_result



def test_flashinfer_verify_metadata_and_mask(v2_base: str, v2_scripts: dict):
    """v2_helpers.FLASHINFER_SCRIPT, run in the patched tree of each base (in the probe's subprocess). Where the
    base builds FlashInfer's verify arguments another way (bases.py ``flashinfer`` false: 0.5.22+, a KV-index
    translator and plan), the old call is gone, which is why DDTree refuses FlashInfer there
    (test_v2_server_args)."""
    if not TRAITS[v2_base].flashinfer:
        got = v2_scripts["flashinfer"]
        assert isinstance(got, str) and "generate_attn_arg_prefill() takes 1 positional argument" in got, got
        return
    got = script_result(v2_scripts, "flashinfer")
    n1, prefix = 10, [7, 0, 12]
    assert got["qo_indptr"] == [0, n1, 2 * n1, 3 * n1], "one query per tree node, N1 per request"
    assert got["kv_indptr"] == [0, 7 + n1, 7 + n1 + n1, 7 + n1 + n1 + 12 + n1]
    assert got["kv_indices"] == got["expect_kv"], "each request's context slots, then its N1 verify slots"
    assert got["mask_numel"] == n1 * (sum(prefix) + 3 * n1)
    assert all(r["context_visible"] and r["tree_equal"] for r in got["rows"]), got["rows"]
