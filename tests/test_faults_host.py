"""The fault-injection suite's short form, second half (the first, and what every trial asserts:
tests/test_faults.py): what the host does to a deploy. sshd restarted during the probe, the disk filling once
`current` moved, the lock broken mid-probe, a hotfix at build, a release_root that resolves into the package, and
hostile YAML, replies and patch sets."""

from __future__ import annotations

import pytest
from fault_bench import bench_on, held
from faults import REPLY_KINDS, SHORT, HostileBench

pytestmark = [pytest.mark.sandbox, pytest.mark.faults]


@pytest.fixture(scope="module")
def bench(sandbox, tmp_path_factory):
    yield from bench_on(sandbox, tmp_path_factory)


@pytest.mark.parametrize("guardian_dies", [False, True])
def test_sshd_restart_during_the_probe(bench, guardian_dies):
    held(bench.sshd_restarted(SHORT["sshd"][0], guardian_dies=guardian_dies))


@pytest.mark.parametrize("cut", [False, True])
def test_disk_full_after_the_switch_rolls_back(bench, cut):
    """The disk fills once `current` moved: the rollback (the run's own, or the guardian's after a cut) needs no new
    space, and the host ends on its last good release, serving it."""
    trial = bench.disk_full_after_switch(SHORT["disk-after"][0], cut=cut)
    held(trial)
    if not cut:  # the crash variant fails its probe: the run rolled back on the full disk and said so
        assert trial.exit_code == 1 and "rolled back" in trial.notes["said"]


def test_rollback_break_lock_mid_probe_settles_once(bench):
    held(bench.break_lock_mid_probe())


def test_hotfix_held_at_build_verified_stops_the_switch(bench):
    held(bench.hotfix_at_build())


@pytest.mark.parametrize("kind", SHORT["paths"])
def test_release_root_resolving_into_the_package(bench, kind):
    """A release_root that the host resolves into the installed package is refused by hosts check, snapshot and
    apply, both spellings shown, the host left byte-identical (the long form runs every spelling)."""
    held(HostileBench(bench).path_trial(kind))


@pytest.mark.parametrize("kind", SHORT["yaml"])
def test_hostile_yaml(bench, kind):
    """A host file YAML alone would accept (`command_timeout: .inf`): refused by hosts check and apply, naming the
    file and the field (tests/cli/test_cli_yaml_inputs.py runs every kind through the installed script)."""
    held(HostileBench(bench).yaml_trial(kind))


@pytest.mark.parametrize("kind", SHORT["hostile"])
def test_hostile_input(bench, kind):
    hb = HostileBench(bench)
    held(hb.reply_trial(kind) if kind in REPLY_KINDS else hb.patchset_trial(kind))
