"""The control side of ``bench`` and ``tune`` without a host: the flag spellings, the host-file edit that keeps
everything else, the prompts file and batch-size parsing, the workload summary, the acceptance profile and the fit
through the runtime's cost model."""
from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy import hostbench, spec_flags
from ddtree_deploy import tune as tune_mod
from ddtree_deploy.errors import InputError, OperationFailed
from ddtree_deploy.hostfile import plan_budget_edit, write_host_file
from ddtree_deploy.inventory import load_host_file

BASE = """\
# gpu box ({comment})
name: gpu1
connection: local
python: /usr/bin/python3
site_packages: /opt/venv/lib/python3.11/site-packages
release_root: /opt/ddtree
server:
  kind: managed
  command: >-
    {{python}} -m sglang.launch_server --model-path /m
    --host {{host}} --port {{port}} {{ddtree_flags}}
{flags}
  port: 30000   # the port
"""


def _host(tmp_path: Path, flags: str, comment: str = "keep me") -> Path:
    path = tmp_path / "gpu1.yaml"
    path.write_text(BASE.format(comment=comment, flags=flags))
    return path


def test_flag_spellings():
    f = "--speculative-algorithm DFLASH --speculative-ddtree-budget 64 --tp 8"
    assert spec_flags.budget_of(f) == "64" and spec_flags.is_ddtree(f)
    assert spec_flags.chain_flags(f) == "--speculative-algorithm DFLASH --tp 8"
    assert not spec_flags.is_ddtree(spec_flags.chain_flags(f))
    assert spec_flags.with_budget(f, "1:64,8:0") == "--speculative-algorithm DFLASH --speculative-ddtree-budget 1:64,8:0 --tp 8"
    assert spec_flags.with_budget("--speculative-algorithm DFLASH --speculative-ddtree-budget=16", "8") == \
        "--speculative-algorithm DFLASH --speculative-ddtree-budget 8"
    assert spec_flags.chain_flags("--speculative-algorithm DDTREE --ddtree-budget 16") == "--speculative-algorithm DFLASH"
    # DDTree's other flags are refused without the budget: the chain drops them too
    f = ("--speculative-algorithm DFLASH --speculative-ddtree-budget 1:64,8:0 --speculative-ddtree-schedule-hold 4 "
         "--speculative-ddtree-adapt --speculative-ddtree-allow-unproven --speculative-ddtree-schedule=1:64,8:0 --tp 8")
    assert spec_flags.chain_flags(f) == "--speculative-algorithm DFLASH --tp 8"
    assert spec_flags.with_budget(f, "32").split()[3:6] == ["32", "--speculative-ddtree-schedule-hold", "4"]
    assert spec_flags.with_budget("--speculative-algorithm DFLASH", "4").endswith("--speculative-ddtree-budget 4")


@pytest.mark.parametrize("flags_line", [
    "  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 64   # tuned by hand",
    "  ddtree_flags: '--speculative-algorithm DFLASH --speculative-ddtree-budget 64'",
    "  ddtree_flags: >-\n    --speculative-algorithm DFLASH\n    --speculative-ddtree-budget 64",
    "  ddtree_flags: --speculative-algorithm DFLASH  # no budget yet",
    "  ddtree_flags: \"--speculative-algorithm DFLASH\"",
])
def test_budget_edit_changes_only_the_budget(tmp_path, flags_line):
    path = _host(tmp_path, flags_line)
    host = load_host_file(path)
    old, new, diff = plan_budget_edit(host, "1:64,8:32,32:0")
    assert old == path.read_text() and diff.count("\n+") >= 1
    written = write_host_file(host, new)
    assert written.server["ddtree_flags"].endswith("--speculative-ddtree-budget 1:64,8:32,32:0")
    assert written.server["ddtree_flags"].startswith("--speculative-algorithm DFLASH")
    text = path.read_text()
    assert "# gpu box (keep me)" in text and "# the port" in text and "command: >-" in text
    assert ("# tuned by hand" in text) == ("# tuned by hand" in flags_line)
    assert [line for line in text.splitlines() if "ddtree_flags" not in line and "budget" not in line] == \
        [line for line in old.splitlines() if "ddtree_flags" not in line and "budget" not in line]
    assert not list(tmp_path.glob("ddtree-tune-*"))  # no temporary file left


def test_budget_edit_is_not_fooled_by_the_flag_in_a_comment(tmp_path):
    # a regex edit could not tell the comment from the field and refused; the YAML round trip edits the field only
    path = _host(tmp_path, "  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 64",
                 comment="was --speculative-ddtree-budget 16")
    host = load_host_file(path)
    _, new, _ = plan_budget_edit(host, "1:64,8:0")
    written = write_host_file(host, new)
    assert written.server["ddtree_flags"] == "--speculative-algorithm DFLASH --speculative-ddtree-budget 1:64,8:0"
    assert path.read_text().startswith("# gpu box (was --speculative-ddtree-budget 16)\n")


def test_budget_edit_keeps_the_file_when_the_result_is_not_a_valid_host_file(tmp_path):
    path = _host(tmp_path, "  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 64")
    host = load_host_file(path)
    before = path.read_text()
    with pytest.raises(InputError, match="gpu1.yaml"):
        write_host_file(host, before.replace("port: 30000", "port: 0"))  # re-validated before it replaces the file
    assert path.read_text() == before and not list(tmp_path.glob("ddtree-tune-*"))


def test_prompts_file_and_sizes(tmp_path):
    assert hostbench.load_prompts(None) == list(hostbench.BUILTIN_PROMPTS)
    p = tmp_path / "p.txt"
    p.write_text("one\n\n two \n")
    assert hostbench.load_prompts(p) == ["one", " two "]
    j = tmp_path / "p.jsonl"
    j.write_text('"a"\n{"text": "b"}\n')
    assert hostbench.load_prompts(j) == ["a", "b"]
    j.write_text('{"text": ""}\n')
    with pytest.raises(InputError, match=r"p\.jsonl:1: expected"):
        hostbench.load_prompts(j)
    with pytest.raises(InputError, match="cannot read"):
        hostbench.load_prompts(tmp_path / "nope.txt")
    assert hostbench.parse_sizes("8,1,8") == [1, 8] and hostbench.parse_sizes(None) is None
    for bad in ("0", "a,b", ""):
        with pytest.raises(InputError, match="--batch-sizes"):
            hostbench.parse_sizes(bad)
    assert tune_mod.parse_budgets(None) == [16, 32, 64] and tune_mod.parse_budgets("64,8") == [8, 64]
    with pytest.raises(InputError, match="--budgets"):
        tune_mod.parse_budgets("0,16")


def test_default_batch_sizes_follow_the_server():
    assert tune_mod.default_batch_sizes({"max_running_requests": 8}) == [1, 2, 4, 8]
    assert tune_mod.default_batch_sizes({"max_running_requests": 48, "cuda_graph_bs": [1, 2, 3, 4, 8, 12, 16, 24, 32, 40]}) \
        == [1, 2, 4, 8, 16, 32]
    assert tune_mod.default_batch_sizes({}) == [1, 2, 4, 8]


def _reply(batch: int, latency: float, verify: int, accept: float | None, tokens: int = 12) -> dict:
    req = {"completion_tokens": tokens, "latency": latency, "spec_verify_ct": verify, "spec_accept_length": accept}
    return {"requests": [dict(req) for _ in range(batch)], "seconds": latency, "concurrency": batch,
            "server_info": {"status": 200, "info": {"internal_states": [
                {"spec_accept_stats": {"ranks": 2, "depth_reached": [10, 5], "rank_hits": [[5, 3], [2, 1]]}}]}}}


def test_summary_and_fit_with_the_runtime_cost_model():
    cfgs = {"chain": hostbench.Config("chain", "--speculative-algorithm DFLASH", "0"),
            "ddtree-8": hostbench.Config("ddtree-8", "--speculative-algorithm DFLASH --speculative-ddtree-budget 8", "8"),
            "plain": hostbench.plain()}
    # batch 1: the tree's round costs 1.1x the chain's; batch 4: 2x (a compute-bound verify)
    ms = [hostbench.summarize(cfgs["chain"], _reply(1, 0.10, 10, 1.5)),
          hostbench.summarize(cfgs["chain"], _reply(4, 0.20, 10, 1.5)),
          hostbench.summarize(cfgs["ddtree-8"], _reply(1, 0.11, 10, 2.0)),
          hostbench.summarize(cfgs["ddtree-8"], _reply(4, 0.40, 10, 2.0)),
          hostbench.summarize(cfgs["plain"], _reply(1, 0.12, 0, None)),
          hostbench.summarize(cfgs["plain"], _reply(4, 0.24, 0, None))]
    chain1 = ms[0]
    assert (chain1.tok_s, chain1.accept_length, chain1.round_ms, chain1.latency_ms) == (120.0, 1.5, 10.0, 100.0)
    assert ms[4].accept_length is None and ms[4].round_ms == 10.0  # plain: one step per token
    res = tune_mod.fit(ms, [8], [1, 4], ms[2].accept_stats, depths=2, margin=0.0)
    assert res["accept_profile"] == [[0.5, 0.3], [0.4, 0.2]]
    assert res["schedule"] == "1:8,4:0"  # the tree pays at batch 1 only
    assert [r["chosen_budget"] for r in res["table"]] == [8, 0]
    assert res["model_tokens_per_round"][8] > 1.5
    with pytest.raises(OperationFailed, match="no per-depth acceptance"):
        tune_mod.accept_profile(None, 2)


def test_acceptance_is_read_from_ddtrees_metrics_when_the_server_serves_them():
    """The workload reply's /metrics lines (before and after) win over spec_accept_stats: the profile is accepted /
    observed per (depth, rank), the cell's acceptance by depth what the workload added."""
    m = tune_mod.metrics_module()
    before, after = m.Totals(), m.Totals()
    before.add_round(9, False, [m.round_entry(8, 1, 8, False)])
    after.add_round(9, False, [m.round_entry(8, 1, 8, False)])
    after.add_round(9, False, [m.round_entry(8, 2, 8, False), m.round_entry(8, 0, 8, False)])
    after.set_ranks([[4, 2], [2, 1]], [[2, 1], [1, 0]])
    reply = {**_reply(2, 0.1, 1, 2.0), "metrics_before": m.render(before.samples()),
             "metrics_after": m.render(after.samples(), {"model_name": "x"})}
    got = hostbench.summarize(hostbench.Config("ddtree-8", "--speculative-ddtree-budget 8", "8"), reply)
    assert got.accept_stats["source"] == "metrics" and got.accept_by_depth == [0.5, 0.5]
    assert got.to_dict()["accept_by_depth"] == [0.5, 0.5] and "accept_stats" not in got.to_dict()
    assert tune_mod.accept_profile(got.accept_stats, 2) == [[0.5, 0.5], [0.5, 0.0]]
    # a server without them: the engine's own counters, as before
    plain = hostbench.summarize(hostbench.Config("ddtree-8", "--speculative-ddtree-budget 8", "8"), _reply(2, 0.1, 1, 2.0))
    assert plain.accept_stats["source"] == "server_info" and plain.accept_by_depth is None
    assert tune_mod.accept_profile(plain.accept_stats, 2) == [[0.5, 0.3], [0.4, 0.2]]
    with pytest.raises(OperationFailed, match=r"sglang:ddtree_draft_rank_\*.*--enable-metrics"):
        tune_mod.accept_profile({"source": "metrics", "rank_observed": []}, 2)


def test_measured_configs_start_with_metrics_on():
    assert spec_flags.with_metrics("--speculative-algorithm DFLASH") == "--speculative-algorithm DFLASH --enable-metrics"
    assert spec_flags.with_metrics("--enable-metrics --tp 2") == "--enable-metrics --tp 2"
    assert spec_flags.with_metrics("") == "--enable-metrics"


def _m(config: str, tok_s: float, batch: int = 1, round_ms: float = 5.0) -> hostbench.Measurement:
    return hostbench.Measurement(config, None, batch, 6, 72, 1.0, tok_s, 2.0, 10.0, 12.0, 1.0, round_ms)


def test_reps_are_combined_into_a_median_and_its_spread():
    m = hostbench.combine([_m("ddtree-16", 100.0, round_ms=5.0), _m("ddtree-16", 90.0, round_ms=6.0),
                           _m("ddtree-16", 120.0, round_ms=4.0)])
    assert (m.reps, m.tok_s, m.tok_s_min, m.tok_s_max) == (3, 100.0, 90.0, 120.0)
    assert (m.round_ms, m.round_ms_min, m.round_ms_max) == (5.0, 4.0, 6.0) and m.requests == 18
    assert m.spread == "100 (90–120) x3"
    one = _m("chain", 50.0)
    assert (one.reps, one.tok_s_min, one.tok_s_max) == (1, 50.0, 50.0)


def test_a_fitted_schedule_that_wins_only_within_the_spread_keeps_the_current_one():
    def cell(config: str, low: float, mid: float, high: float, batch: int = 1) -> hostbench.Measurement:
        return hostbench.combine([_m(config, low, batch), _m(config, mid, batch), _m(config, high, batch)])

    overlapping = [cell("ddtree-16", 95, 100, 105), cell("ddtree-32", 98, 103, 110)]
    cells = tune_mod.within_noise("16", "32", overlapping, [1])
    assert cells == [{"batch": 1, "current": 16, "fitted": 32, "current_tok_s": "100 (95–105) x3",
                      "fitted_tok_s": "103 (98–110) x3"}]
    clear = [cell("ddtree-16", 95, 100, 105), cell("ddtree-32", 120, 125, 130)]
    assert tune_mod.within_noise("16", "32", clear, [1]) is None  # a real gain: written
    assert tune_mod.within_noise("16", "16", clear, [1]) == []  # the same schedule: nothing differs
    assert tune_mod.within_noise("64", "32", clear, [1]) is None  # the current budget was not measured
    assert tune_mod.within_noise(None, "32", clear, [1]) is None


def test_budget_edit_keeps_a_value_folded_over_lines_as_it_was(tmp_path):
    # yaml.safe_dump folds a long quoted command over two lines; a YAML writer would put it back on one: only the
    # ddtree_flags line may change (and its comment keeps its two spaces)
    path = tmp_path / "gpu1.yaml"
    text = ("# tune test host\nname: gpu1\nconnection: local\npython: /usr/bin/python3\n"
            "site_packages: /opt/venv/lib/python3.11/site-packages\nrelease_root: /opt/ddtree\nserver:\n"
            "  kind: managed\n  command: '{python} -m ddtree_refengine --host {host} --port {port} --step-cost-ms\n"
            "    4 --verify-token-cost-us 60 {ddtree_flags}'\n"
            "  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 16  # the budget tune rewrites\n"
            "  port: 30000\n")
    path.write_text(text)
    host = load_host_file(path)
    _, new, diff = plan_budget_edit(host, "1:4,2:16")
    changed = [(a, b) for a, b in zip(text.splitlines(), new.splitlines(), strict=True) if a != b]
    assert changed == [("  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 16  # the budget tune rewrites",
                        "  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget 1:4,2:16  # the budget tune rewrites")]
    assert write_host_file(host, new).server["command"] == host.server["command"]
