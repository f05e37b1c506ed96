"""DDTree's metrics and per-request budgets on every spec-v2 base, through the base's own classes (v2_helpers'
METRICS_SCRIPT, run once per base with the plugin's hooks applied as in a server process):

- a request's ``custom_params.ddtree`` is checked by the hook after ``SamplingParams.verify`` once DDTree's flags
  resolved in the process (a bad one names the field), and ignored before;
- a round whose requests asked for less cuts their trees to their own budgets: each request's walk equals the walk of
  a tree built at its budget alone, and ``speculative: false`` accepts nothing;
- the result processor's real ``_resolve_spec_v2_tokens`` with the hook after it: one round entry per request
  ``[budget, accepted, drafted, chain]`` on the first token of the round, aligned with the request's output tokens
  (0.5.15+), the chain round's record matched without a tag;
- the tokenizer manager's real ``_calculate_spec_decoding_metrics`` with the hook after it: the summary beside
  SGLang's own spec_* fields, the raw entries gone;
- ``/metrics`` through prometheus_client: the families with SGLang's labels, the counts the rounds gave, and no name
  that SGLang itself defines anywhere in the base;
- no host sync in the round's metrics code: it runs on meta tensors (where any read of a device value fails) and
  its op log holds no op that reads a value back.
"""
from __future__ import annotations

import pytest
from v2_helpers import script_result

#: Ops that read a device value on the host (a sync on a GPU): none may appear in the round's metrics code.
HOST_READS = {"aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.nonzero",
              "aten.masked_select", "aten.unique", "aten._unique2", "aten.unique_consecutive", "aten.allclose"}


@pytest.fixture(scope="module")
def got(v2_scripts):
    return script_result(v2_scripts, "metrics")


def test_a_requests_setting_is_checked_when_it_arrives_on_a_ddtree_server(got):
    assert got["check_off"] == "ok", "before DDTree's flags resolve, the key means nothing and is not checked"
    on = got["check_on"]
    assert on["bad_budget"].startswith("sampling_params.custom_params.ddtree.budget: expected an integer from 0")
    assert "'budegt'" in on["unknown"] and "known: 'budget', 'speculative'" in on["unknown"]
    assert on["good"] == on["off"] == on["none"] == "ok"


def test_each_request_commits_what_a_round_at_its_own_budget_would(got):
    assert got["caps"] == [8, 3, 0], "the server's budget, its own 3, speculative false"
    assert got["tree_accept"] == got["solo_accept"]
    assert got["tree_accept"][2] == 0 and got["tree_accept"][0] > got["tree_accept"][1] > 0
    assert [r["tokens"] for r in got["rounds"]] == [[a + 1 for a in got["tree_accept"]], [3, 1, 6]]


def test_round_entries_ride_the_output_tokens_on_bases_whose_streamer_aligns_them(got):
    if not got["meta_info_base"]:  # 0.5.14: server-wide /metrics only (bases.py meta_info)
        assert got["entries"] == [[], [], []]
        assert all(not any(k.startswith("ddtree_") for k in m) for m in got["meta_info"])
        return
    assert all(all(r["aligned"]) for r in got["rounds"]), "one value per output token, as SGLang's streamer slices"
    (a0, a1, a2), depth = got["tree_accept"], 5
    assert got["entries"] == [[[8, a0, 8, 0], [0, 2, depth, 1]],
                              [[3, a1, 3, 0], [0, 0, depth, 1]],
                              [[0, a2, 0, 0], [0, 5, depth, 1]]], "a chain round's setting is the chain's"


def test_finished_requests_get_the_summary_beside_sglangs_own_fields(got):
    if not got["meta_info_base"]:
        return
    (a0, _, _) = got["tree_accept"]
    first = got["meta_info"][0]
    assert first["spec_verify_ct"] == 2 and "spec_accept_length" in first, "SGLang's own fields stay"
    assert "ddtree_round" not in first
    assert first["ddtree_verify_ct"] == 2 and first["ddtree_chain_rounds"] == 1
    assert first["ddtree_accepted_tokens"] == a0 + 2 and first["ddtree_draft_tokens"] == 8 + 5
    assert first["ddtree_accept_length"] == pytest.approx(1 + (a0 + 2) / 2)
    assert first["ddtree_budget"] == {"min": 0, "median": 4, "max": 8}
    assert first["ddtree_accepted_per_depth"] == [sum(a >= d for a in (a0, 2)) for d in range(1, 6)]
    off = got["meta_info"][2]
    assert off["ddtree_budget"] == {"min": 0, "median": 0, "max": 0} and off["ddtree_accepted_per_depth"][0] == 1


def test_metrics_scrape_counts_the_rounds_with_sglangs_labels_and_clashes_with_nothing(got):
    s = got["scrape"]
    accepted = sum(got["tree_accept"]) + 3 - 1 + 1 - 1 + 6 - 1
    assert s["drafts"] == 6 and s["accepted_tokens"] == accepted and s["chain_rounds"] == 1
    assert s["draft_tokens"] == 8 + 3 + 0 + 3 * 5
    assert s["rounds"] == {"9": 1, "6": 1}, "verify widths: budget + 1 for the tree, the block for the chain"
    assert s["accepted_per_depth"][0] == sum(a >= 1 for a in got["tree_accept"]) + 2  # chain: 2, 0, 5 accepted
    obs, hit = s["rank_observed"], s["rank_accepted"]
    assert len(obs) == len(hit) and obs and all(h <= o for ro, rh in zip(obs, hit, strict=True) for o, h in zip(ro, rh, strict=True))
    assert sum(hit[d][0] for d in range(len(hit))) == sum(got["tree_accept"]), "the target agreed with rank 0"
    assert all('model_name="tiny"' in lab and 'tp_rank="0"' in lab for lab in got["labels"])
    assert got["sglang_names"] > 50 and any("spec" in n for n in got["sglang_spec_names"])
    assert got["clash"] == []


def test_the_rounds_metrics_code_reads_no_device_value(got):
    run = got["meta_run"]
    assert run["ok"], run.get("error")
    assert run["counts_device"] == "meta", "the counters stay on the round's device"
    assert "aten.index_add_" in run["ops"] and not HOST_READS & set(run["ops"])
