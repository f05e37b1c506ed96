"""The fault-injection suite's short form (bench/faults.py; the long form is `make faults`, results in
bench/results/faults.md), first half: the transaction under cuts, signals, a server that never starts and a killed
guardian. One trial of a selection of its faults, through the real CLI against the session's sandbox host, with the
tests' stand-in server (it starts in a fraction of the reference engine's time; `make faults` runs the reference
engine). Each trial asserts the transaction held: the installed package byte-identical, nothing pending and the
active release good, `probe` passing, the lock free with no stray file, and a re-run succeeding. What the host does
to a deploy (sshd restarts, a full disk, a broken lock, a hotfix, hostile paths and input) is the second half,
tests/test_faults_host.py. A full disk at the lock is in test_transaction.py and test_release.py; the long form runs
it at four sizes."""

from __future__ import annotations

import signal

import pytest
from fault_bench import bench_on, held
from faults import SHORT, untrue_rollback_lines

pytestmark = [pytest.mark.sandbox, pytest.mark.faults]


@pytest.fixture(scope="module")
def bench(sandbox, tmp_path_factory):
    yield from bench_on(sandbox, tmp_path_factory)


@pytest.mark.parametrize("i", [0])
def test_cut_mid_push(bench, i):
    """Defect 1: a cut while the release is being built leaves the host on its release, nothing half-switched."""
    held(bench.cut_mid_push(i))


@pytest.mark.parametrize("point", SHORT["cut"])
def test_cut(bench, point):
    """A cut before the probe, and one during it (after which the run's next call reconnects silently): held, and
    no rollback line the host does not back (a false "probe stage … failed; rolling back" before the final line)."""
    trial = bench.cut_at(point)
    held(trial)
    assert trial.checks["true-words"], trial.notes.get("untrue")


def test_a_rollback_line_needs_the_hosts_mark():
    """The check behind "true-words": the run's rollback line is true only when the host journalled that rollback
    (its mark of the failed release as bad, with the same reason); the old "failed; rolling back" never is."""
    said = ("faults: probe stage generation failed: connection lost during the probe's\n generation; rolled back to "
            "release r1; probing it\nfaults: rolled-back")
    mark = {"event": "mark", "status": "bad", "release": "r2",
            "note": "probe stage generation failed: connection lost during the probe's generation"}
    assert untrue_rollback_lines(said, [mark]) == []
    assert untrue_rollback_lines(said, [dict(mark, status="interrupted")])  # the guardian's mark is not the run's
    assert untrue_rollback_lines("faults: probe stage startup failed: x; rolling back\n", [mark])


@pytest.mark.parametrize("point", SHORT["sigint"])
def test_sigint(bench, point):
    trial = bench.signal_at(signal.SIGINT, point)
    held(trial)
    assert trial.exit_code in (0, 130)


@pytest.mark.parametrize("point", SHORT["sigkill"])
def test_sigkill(bench, point):
    held(bench.signal_at(signal.SIGKILL, point))


@pytest.mark.parametrize("variant", ["hang"])
def test_server_fails_at_start(bench, variant):
    trial = bench.server_failure(variant)
    held(trial)
    if variant == "hang":
        assert "start-up made no progress" in trial.notes["failure"]



# -- a killed guardian (one moment here; `make faults` runs every moment) ------------------------------------------
@pytest.mark.parametrize("point", SHORT["guardian"])
def test_guardian_killed_is_detected_and_settled(bench, point):
    """A SIGKILLed guardian: the CLI sees its lease end, settles the host itself and says so, within seconds."""
    trial = bench.guardian_killed(point)
    held(trial)
    assert trial.checks["no-false-wait"] and trial.notes["detected_s"] < 30
