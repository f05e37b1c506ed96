"""The reference engine's DDTree metrics and per-request budgets, as the SGLang patch set has them (the runtime's
``metrics.py``, ``prune_tree``, ``schedule.request_budget``), and the control side reading them back:

- a request's own budget: greedy output unchanged, and each round commits exactly what a run at that budget commits
  (0 / ``speculative: false``: one token per round, as plain decoding); a chain round stays the chain;
- ``/metrics`` and ``meta_info`` over HTTP from the engine run as a sandbox host runs it, a bad setting refused
  naming the field;
- ``bench`` / ``tune``'s reading: the host-side ``workload`` op fetches the families before and after, ``summarize``
  takes the per-depth acceptance from them, and ``tune``'s profile from them equals the one from the engine's
  ``spec_accept_stats``.
"""
from __future__ import annotations

import importlib
import json
import os
import threading
import urllib.error
import urllib.request

import pytest
from ddtree_refengine.decode import Engine, SamplingParams
from ddtree_refengine.models import ModelConfig, build_target
from ddtree_refengine.server import Batcher
from ddtree_refengine.tokenizer import encode
from refengine_helpers import start_server
from test_refengine_server import release_dir  # noqa: F401 - the fixture: a release vendoring the runtime

from ddtree_deploy import hostbench, tune
from ddtree_deploy.remote import probe as host_probe

PROMPTS = ["Hello world", "The quick brown fox", "0123456789"]


@pytest.fixture(scope="module")
def target():
    return build_target(ModelConfig())


def _alone(target, runtime, prompt: str, budget: int, max_new: int = 24):
    return Engine(target, "DDTREE", runtime, budget=budget, block_size=8).generate(
        encode(prompt), SamplingParams(max_new, 0.0))


@pytest.mark.parametrize("own", [0, 3, 8])
def test_a_requests_budget_commits_what_a_run_at_that_budget_commits(target, runtime, own):
    """In rounds at budget 16, a request that asked for ``own`` commits per round what a server at ``own`` commits
    (0: the root alone, one token per round); the output is the greedy output either way."""
    plain = Engine(target, "NONE")
    engine = Engine(target, "DDTREE", runtime, budget=16, block_size=8)
    for prompt in PROMPTS:
        got = engine.generate(encode(prompt), SamplingParams(24, 0.0, budget=own))
        assert got.output_ids == plain.generate(encode(prompt), SamplingParams(24, 0.0)).output_ids
        if own == 0:
            assert set(got.round_commits) == {1} and got.round_entries[0] == [0, 0, 0, 0]
        else:
            assert got.round_commits == _alone(target, runtime, prompt, own).round_commits
            assert {e[0] for e in got.round_entries} == {own} and {e[2] for e in got.round_entries} == {own}


def test_a_chain_round_stays_the_chain_whatever_a_request_asks(target, runtime):
    engine = Engine(target, "DDTREE", runtime, budget=16, block_size=8)
    req = engine.start(encode(PROMPTS[0]), SamplingParams(24, 0.0, budget=0))
    engine.step(req, 0)  # the schedule's 0 at this batch size
    assert req.result.round_entries == [[0, req.result.round_commits[0] - 1, 7, 1]]


def test_batched_requests_keep_their_own_budgets_and_the_totals_count_them(target, runtime):
    metrics = importlib.import_module(runtime.__name__ + ".metrics")
    engine = Engine(target, "DDTREE", runtime, budget=16, block_size=8)
    batcher = Batcher(engine, lambda bs: 16, max_running=3)
    out = [None] * 3
    budgets = [None, 4, 0]

    def one(i: int) -> None:
        out[i] = batcher.submit(encode(PROMPTS[i]), SamplingParams(20, 0.0, budget=budgets[i]), seed=i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [{e[0] for e in r.round_entries} for r in out] == [{16}, {4}, {0}]
    acc = metrics.acceptance(metrics.render(batcher.totals.samples()))
    entries = [e for r in out for e in r.round_entries]
    assert acc["drafts"] == len(entries) and acc["accepted_tokens"] == sum(e[1] for e in entries)
    assert acc["draft_tokens"] == sum(e[2] for e in entries) and acc["rounds"] == {"17": batcher.steps}
    assert acc["accepted_per_depth"][0] == sum(e[1] >= 1 for e in entries)
    assert sum(v["count"] for v in acc["round_seconds"].values()) == batcher.steps


@pytest.fixture
def server(site_dir, release_dir, tmp_path):  # noqa: F811 - the imported fixture
    srv = start_server(site_dir, tmp_path, ["--speculative-algorithm", "DFLASH", "--speculative-ddtree-budget", "16",
                                            "--block-size", "8", "--enable-metrics"],
                       {"PYTHONPATH": f"{site_dir}{os.pathsep}{release_dir}"})
    yield srv
    srv.stop()


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_metrics_and_meta_info_over_http_and_read_back_as_bench_and_tune_read_them(server, runtime):
    assert server.port is not None, server.proc.stderr.read()
    metrics = importlib.import_module(runtime.__name__ + ".metrics")
    status, out = _post(server.url + "/generate", {"text": PROMPTS[0], "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "ignore_eos": True, "custom_params": {"ddtree": {"budget": 4}}}})
    meta = out["meta_info"]
    assert status == 200 and set(metrics.META_KEYS) <= set(meta)
    assert meta["ddtree_budget"] == {"min": 4, "median": 4, "max": 4} and meta["ddtree_chain_rounds"] == 0
    assert meta["ddtree_verify_ct"] == meta["spec_verify_ct"] and len(meta["ddtree_accepted_per_depth"]) == 7
    assert meta["ddtree_accept_length"] >= meta["spec_accept_length"], "SGLang's counts kept tokens (max_new cut)"
    status, bad = _post(server.url + "/generate", {"text": "x", "sampling_params": {
        "custom_params": {"ddtree": {"budget": "lots"}}}})
    assert status == 400 and "sampling_params.custom_params.ddtree.budget" in bad["error"]["message"]

    # what bench and tune run on the host: the workload op with DDTree's families before and after
    reply = host_probe.workload(server.url, PROMPTS, 16, concurrency=3, metrics_prefix=tune.metrics_module().PREFIX)
    assert reply["metrics_before"] and reply["metrics_after"] and "# TYPE" in reply["metrics_after"]
    assert all(line.startswith(("sglang:ddtree_", "# HELP sglang:ddtree_", "# TYPE sglang:ddtree_"))
               for line in reply["metrics_after"].splitlines())
    m = hostbench.summarize(hostbench.Config("ddtree-16", "--speculative-ddtree-budget 16", "16"), reply)
    assert m.accept_stats["source"] == "metrics"
    added = metrics.difference(metrics.acceptance(reply["metrics_after"]), metrics.acceptance(reply["metrics_before"]))
    assert added["drafts"] == sum(r["spec_verify_ct"] for r in reply["requests"])
    assert m.accept_by_depth == metrics.accept_by_depth(added) and 0 < m.accept_by_depth[0] <= 1
    assert m.accept_by_depth == sorted(m.accept_by_depth, reverse=True), "a path reaches d only through d - 1"
    # tune's profile from /metrics equals the one from the engine's own counters (every rank observed there)
    engine_stats = {"source": "server_info",
                    **reply["server_info"]["info"]["internal_states"][0]["spec_accept_stats"]}
    assert tune.accept_profile(m.accept_stats, 7) == tune.accept_profile(engine_stats, 7)
    assert host_probe.metrics(server.url, "sglang:nothing_") is None, "no such families: nothing"
