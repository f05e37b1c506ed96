"""The verify metadata a mask-reading backend gets from a DDTree verify input, on the real patched SGLang, on CPU.

FlashInfer (wired, refused by default as not proven on a GPU here) plans TARGET_VERIFY from
`DFlashVerifyInput.generate_attn_arg_prefill`: query offsets of width N1, KV indices of each request's context
plus its N1 verify slots, and the flat custom mask, which for FlashInfer must mark the context columns visible
(`prefix_cols=True`). The triton backend's layout (tree block only) is covered by tests/runtime/test_mask.py and
was proven on the H200. Each base's classes and the worker's start-up check are held against the backends table
(patches/ddtree/spec-v2/backends.py).
"""
from __future__ import annotations

from v2_helpers import BACKENDS_TABLE, TRAITS, script_result



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


def test_backends_table_against_the_base(v2_base: str, v2_probe: dict):
    """Every row of patches/ddtree/spec-v2/backends.py names an ``--attention-backend`` value the base accepts and a
    class it has; the worker's start-up check (``DDTreeRound.check_target``, on the class a hybrid wrapper holds)
    lets the proven backend run with its mask layout, the wired-unproven one only behind the flag (with the context
    columns written), and refuses the rest with the reason."""
    assert BACKENDS_TABLE.BACKENDS, "the table has rows"
    for name, seen in v2_probe["backends"].items():
        assert seen == {"choice": True, "class": True}, (name, seen)
    checks = v2_probe["check_target"]
    for name, row in BACKENDS_TABLE.BACKENDS.items():
        default, allowed = checks[f"{row.cls}/default"], checks[f"{row.cls}/allow"]
        if row.status == BACKENDS_TABLE.PROVEN:
            assert default == allowed == {"ok": True, "name": name, "prefix_cols": row.reads_context_columns}
        elif row.status == BACKENDS_TABLE.WIRED_UNPROVEN:
            assert not default["ok"] and "is not proven with the " + name in default["msg"], default
            assert row.reason in default["msg"] and "--speculative-ddtree-allow-unproven" in default["msg"]
            assert allowed == {"ok": True, "name": name, "prefix_cols": row.reads_context_columns}
        else:
            for got in (default, allowed):
                assert not got["ok"] and "does not support the " + name in got["msg"], got
                assert row.reason in got["msg"] and "use --attention-backend triton" in got["msg"], got
    for kind in ("default", "allow"):  # a class the table does not know
        got = checks[f"TorchNativeAttnBackend/{kind}"]
        assert not got["ok"] and "attention backend TorchNativeAttnBackend (DDTree needs a tree mask" in got["msg"]


def test_tree_verifies_reach_ddtree_attention_through_the_backends_extend_kernel(v2_base: str, v2_scripts: dict):
    """spec-v2/verify_attention.py on each base's real triton backend: the extend kernel the backend keeps as
    ``extend_attention_fwd`` (found in its own ``__init__``) is what ``forward_extend`` calls (from 0.5.22 through
    ``_forward_extend_kernel``); wrapped, a call laid
    out as ``forward_extend`` makes it goes to DDTree's kernel only with a tree mask and nothing the kernel does not
    compute (a sliding window, sinks), with the layer's scale and the verify width; the default leaves the backend
    alone; installing twice wraps once; a bad ``DDTREE_VERIFY_ATTN`` is refused naming the variable."""
    got = script_result(v2_scripts, "verify_attention")
    assert got["hook_point"], "forward_extend calls self.extend_attention_fwd"
    assert got["chain"] == [1, 0] and got["tree"] == [1, 1], got
    for case in ("window", "sinks"):
        assert got[case] is None or got[case][1] == 1 and got[case][0] > 1, (case, got[case])
    assert got["tree_args"] == [{"scale": 0.125, "max_len": 2, "mask_is_arg": True}]
    assert got["default_installs"] is False
    assert got["installs"] == [True, True] and got["wrapped_once"]
    assert "DDTREE_VERIFY_ATTN='fast'" in got["bad_value"] and "sglang, ddtree" in got["bad_value"]


def test_paged_commit_copies_the_path_into_its_pages(v2_base: str, v2_scripts: dict):
    """Page size > 1 (spec-v2/round.py ``paged_kv_rows`` and the runtime's ``move_path_kv``) on the base's real
    ``MHATokenToKVPool`` (page size 16, 3 layers, on CPU): the path's rows are copied to the slots of their positions
    in every layer's K and V and the other rows stay; a pool in another layout, with per-row scales or without
    per-layer lists is refused with why; a hybrid's full-attention pool is the one used."""
    got = script_result(v2_scripts, "paged_commit")
    assert got["buffers"] == 6 and got["row"] == 16, "3 layers' K and V, rows of 2 heads x 8"
    # request 0: path 0 -> 2 -> 3 -> 5 into slots 16..19 (positions prefix + 0..3); slots 20, 21 keep theirs
    assert got["k"] == [[16 + 100 * layer, 18 + 100 * layer, 19 + 100 * layer, 21 + 100 * layer, 20 + 100 * layer,
                         21 + 100 * layer] for layer in range(3)], got["k"]
    # request 1: path 0 -> 1 is already in place: nothing moves
    assert got["v"] == [[-(s + 100 * layer) for s in range(32, 36)] for layer in range(3)], got["v"]
    assert "'hnd' layout" in got["hnd"] and "token-major" in got["hnd"]
    assert "per-row scales" in got["scales"]
    assert "no per-layer k_buffer / v_buffer" in got["no_lists"]
    assert got["hybrid"] == 6
