"""The fault-injection suite's short form (bench/faults.py; the long form is `make faults`, results in
bench/results/faults.md): one trial of a selection of its faults, through the real CLI against the session's sandbox
host, with the tests' stand-in server (it starts in a fraction of the reference engine's time; `make faults` runs
the reference engine). Each trial asserts the transaction held: the installed package byte-identical,
nothing pending and the active release good, `probe` passing, the lock free with no stray file, and a re-run
succeeding. A full disk is in test_transaction.py and test_release.py; the long form runs it at four sizes."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from faults import REPLY_KINDS, SHORT, FaultBench, HostileBench, Trial, untrue_rollback_lines  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.faults]


@pytest.fixture(scope="module")
def bench(sandbox, tmp_path_factory):
    sbox = sandbox.state.hosts[sandbox.base.name]
    b = FaultBench(sbox, sandbox.base, tmp_path_factory.mktemp("faults"), log=lambda m: None, engine="standin",
                   box=sandbox.box)
    b.setup()
    yield b
    b.teardown_disk()
    b.teardown()


def _held(trial: Trial) -> None:
    assert trial.held, json.dumps(dataclasses.asdict(trial), indent=1, default=str)[:6000]


@pytest.mark.parametrize("i", [0])
def test_cut_mid_push(bench, i):
    """Defect 1: a cut while the release is being built leaves the host on its release, nothing half-switched."""
    _held(bench.cut_mid_push(i))


@pytest.mark.parametrize("point", SHORT["cut"])
def test_cut(bench, point):
    """A cut before the probe, and one during it (after which the run's next call reconnects silently): held, and
    no rollback line the host does not back (a false "probe stage … failed; rolling back" before the final line)."""
    trial = bench.cut_at(point)
    _held(trial)
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
    _held(trial)
    assert trial.exit_code in (0, 130)


@pytest.mark.parametrize("point", SHORT["sigkill"])
def test_sigkill(bench, point):
    _held(bench.signal_at(signal.SIGKILL, point))


@pytest.mark.parametrize("variant", ["hang"])
def test_server_fails_at_start(bench, variant):
    trial = bench.server_failure(variant)
    _held(trial)
    if variant == "hang":
        assert "start-up made no progress" in trial.notes["failure"]



# -- the harder faults (one moment each here; `make faults` runs every moment) ---------------------------------------------
@pytest.mark.parametrize("point", SHORT["guardian"])
def test_guardian_killed_is_detected_and_settled(bench, point):
    """A SIGKILLed guardian: the CLI sees its lease end, settles the host itself and says so, within seconds."""
    trial = bench.guardian_killed(point)
    _held(trial)
    assert trial.checks["no-false-wait"] and trial.notes["detected_s"] < 30


@pytest.mark.parametrize("guardian_dies", [False, True])
def test_sshd_restart_during_the_probe(bench, guardian_dies):
    _held(bench.sshd_restarted(SHORT["sshd"][0], guardian_dies=guardian_dies))


@pytest.mark.parametrize("cut", [False, True])
def test_disk_full_after_the_switch_rolls_back(bench, cut):
    """The disk fills once `current` moved: the rollback (the run's own, or the guardian's after a cut) needs no new
    space, and the host ends on its last good release, serving it."""
    trial = bench.disk_full_after_switch(SHORT["disk-after"][0], cut=cut)
    _held(trial)
    if not cut:  # the crash variant fails its probe: the run rolled back on the full disk and said so
        assert trial.exit_code == 1 and "rolled back" in trial.notes["said"]


def test_rollback_break_lock_mid_probe_settles_once(bench):
    _held(bench.break_lock_mid_probe())


def test_hotfix_held_at_build_verified_stops_the_switch(bench):
    _held(bench.hotfix_at_build())


@pytest.mark.parametrize("kind", SHORT["paths"])
def test_release_root_resolving_into_the_package(bench, kind):
    """A release_root that the host resolves into the installed package is refused by hosts check, snapshot and
    apply, both spellings shown, the host left byte-identical (the long form runs every spelling)."""
    _held(HostileBench(bench).path_trial(kind))


@pytest.mark.parametrize("kind", SHORT["yaml"])
def test_hostile_yaml(bench, kind):
    """A host file YAML alone would accept (`command_timeout: .inf`): refused by hosts check and apply, naming the
    file and the field (tests/cli/test_cli_yaml_inputs.py runs every kind through the installed script)."""
    _held(HostileBench(bench).yaml_trial(kind))


@pytest.mark.parametrize("kind", SHORT["hostile"])
def test_hostile_input(bench, kind):
    hb = HostileBench(bench)
    _held(hb.reply_trial(kind) if kind in REPLY_KINDS else hb.patchset_trial(kind))
