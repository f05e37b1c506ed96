"""The live figures ``probe`` and ``releases`` show (``live.summarize``), from two scrapes of DDTree's ``/metrics``
families rendered by the runtime's own ``metrics.Totals`` (what the reference engine serves; the patch set counts
alike): accept length 1 + accepted / drafts and tokens per second over the window, "idle" for a window without a
round (never a speed of 0.0), the reason when the counters cannot be read or went back."""
from __future__ import annotations

import pytest

from ddtree_deploy import live
from ddtree_deploy.runtime_files import metrics_module


def _scrape(totals) -> str:
    return metrics_module().render(totals.samples(), {"model_name": "m"})


@pytest.fixture()
def totals():
    t = metrics_module().Totals()
    t.add_round(17, False, [[16, 3, 16, 0], [16, 1, 16, 0]])  # two requests: 3 and 1 accepted
    return t


def test_a_window_with_rounds_gives_its_accept_length_and_tokens_per_second(totals):
    before = _scrape(totals)
    totals.add_round(17, False, [[16, 4, 16, 0], [16, 2, 16, 0]])
    totals.add_round(17, False, [[16, 5, 16, 0]])
    doc = live.summarize({"before": before, "after": _scrape(totals), "seconds": 0.5})
    assert doc["status"] == "decoding" and doc["window_s"] == 0.5
    assert doc["window"] == {"drafts": 3, "accepted_tokens": 11, "tokens": 14}
    assert doc["mean_acceptance_length"] == round(1 + 11 / 3, 3)
    assert doc["decode_tokens_per_s"] == 28.0  # (3 drafts + 11 accepted) / 0.5 s
    odd = live.summarize({"before": before, "after": _scrape(totals), "seconds": 0.49451})
    assert odd["window_s"] == 0.4945 and odd["decode_tokens_per_s"] == round(14 / odd["window_s"], 1)
    assert doc["mean_acceptance_length_since_start"] == round(1 + 15 / 5, 3)
    assert doc["since_start"] == {"drafts": 5, "accepted_tokens": 15}
    accept, speed, note = live.cells(doc)
    assert (accept, speed) == (str(round(1 + 11 / 3, 3)), "28.0") and "14 tokens in 3 drafts" in note


def test_an_idle_window_says_idle_and_keeps_the_accept_length_since_start(totals):
    text = _scrape(totals)
    doc = live.summarize({"before": text, "after": text, "seconds": 2.0})
    assert doc["status"] == "idle" and doc["decode_tokens_per_s"] is None and doc["mean_acceptance_length"] is None
    assert doc["mean_acceptance_length_since_start"] == 3.0
    accept, speed, note = live.cells(doc)
    assert (accept, speed) == ("3.0 (since start)", "idle") and "0.0" not in note


def test_no_counters_an_error_or_a_restart_is_unavailable_with_the_reason(totals):
    down = live.summarize({"error": "GET /metrics failed: [Errno 111] Connection refused"})
    assert down["status"] == "unavailable" and down["decode_tokens_per_s"] is None
    assert live.cells(down) == ["-", "-", "GET /metrics failed: [Errno 111] Connection refused"]
    assert live.summarize({"before": "", "after": "", "seconds": 1.0})["status"] == "unavailable"
    after = _scrape(totals)
    totals.add_round(17, False, [[16, 4, 16, 0]])
    went_back = live.summarize({"before": _scrape(totals), "after": after, "seconds": 1.0})
    assert went_back["status"] == "unavailable" and "restarted" in went_back["reason"]
    assert went_back["mean_acceptance_length_since_start"] == 3.0


def test_the_ansible_modules_reads_give_the_same_figures(totals):
    """``probe --engine ansible``: ddtree_probe returns the two reads as ``live_window``; the figures and their
    definitions are the builtin engine's, and a missing or skipped read says why."""
    before = _scrape(totals)
    totals.add_round(17, False, [[16, 4, 16, 0]])
    reads = {"before": before, "after": _scrape(totals), "seconds": 1.0}
    doc = live.from_module(reads, 1.0)
    assert {k: v for k, v in doc.items() if k not in ("source", "definitions")} == live.summarize(reads)
    assert doc["definitions"] == live.DEFINITIONS and doc["decode_tokens_per_s"] == 5.0
    assert live.from_module(None, 0.0)["reason"] == "not read (--live-window 0)"
    assert "returned no reads" in live.from_module(None, 1.0)["reason"]
    assert live.from_module({"error": "no server configured (server.kind: none)"}, 1.0)["status"] == "unavailable"
