"""The deploy transaction's invariant on real sandbox hosts (docs/design.md, "The deploy transaction"): a host is on
its last good release, or on a new release that a run is probing and will roll back on any failure or interruption;
a release switched in but not probed is never left behind silently.

Here: the host's guardian rolls back a run whose control side vanished; a pending switch that nobody settled (the
guardian died, as in a reboot) is settled by the next command, which says so (rolled back, or probed and kept);
steps of a run that lost its lock are refused; every write command takes the lock; a full disk at the lock step is
a clear error with no stray file. Cuts, signals, disk sizes and concurrency at many points are in test_faults.py.
"""

from __future__ import annotations

import json

import pytest

from ddtree_deploy.errors import EXIT_LOCKED, Fenced, OperationFailed
from ddtree_deploy.probe import guard_spec
from ddtree_deploy.release import LockHeld, ReleaseManager
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transaction import run_on_host
from ddtree_deploy.transport import HostConnection
from standin.helpers import deployed_standin, overlay, remove_root, run_cli, standin_host, write_host_yaml

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def good(sandbox, tmp_path_factory):
    """A host copy (stand-in server) with one good release, its host file in an inventory of its own."""
    inv = tmp_path_factory.mktemp("tx") / "hosts"
    host, (report,) = deployed_standin(sandbox.base, "t-tx", inv, None)
    assert report.status == "ok", report.message
    yield host, inv, report.release
    remove_root(host)


def _show(host):
    with HostConnection(host) as conn:
        return ReleaseManager(conn).show(journal_lines=20)


def _leave_pending(host, ov, *, restarted=False):
    """A run that pushed and switched (and with ``restarted`` restarted the server onto the release), then lost
    its guardian (killed, as a reboot or the OOM killer would): the host keeps `pending` and a lock whose holder is
    gone. Returns the release left pending."""
    conn = HostConnection(host)
    conn.open()
    mgr = ReleaseManager(conn)
    mgr.acquire("ddtree-deploy apply (test: guardian dies)", guard=guard_spec(host))
    pushed = mgr.push(ov)
    mgr.switch(pushed.release_id, probing=True)
    if restarted:
        ServerControl(conn, mgr.fence).restart(release=pushed.release_id)
    holder = mgr.show()["lock"]["holder_pid"]
    conn.run(f"kill -9 {holder}")
    mgr.lease = None
    conn.close()
    info = _show(host)
    assert info["state"]["pending"]["release"] == pushed.release_id and info["lock_state"] == "dead"
    return pushed.release_id


def test_guardian_rolls_back_when_the_control_side_vanishes(good):
    """The run's connection closes in the middle of its probe (its process died): the host switches back, marks the
    unprobed release interrupted, restarts the server on the good release and frees the lock, on its own."""
    host, _, release = good
    conn = HostConnection(host)
    conn.open()
    mgr = ReleaseManager(conn)
    mgr.acquire("ddtree-deploy apply (test: control side dies)", guard=guard_spec(host))
    pushed = mgr.push(overlay(version="0.2.0-vanish"))
    mgr.switch(pushed.release_id, probing=True)
    ServerControl(conn, mgr.fence).restart(release=pushed.release_id)
    conn.close()  # end of input for the guardian: exactly what a kill -9 of the tool does
    import time

    deadline = time.monotonic() + 60
    while _show(host)["lock"] is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    info = _show(host)
    st = info["state"]
    assert info["lock"] is None and st["pending"] is None
    assert st["active"] == release and info["current"] == f"releases/{release}"
    rel = next(r for r in st["releases"] if r["id"] == pushed.release_id)
    assert rel["status"] == "interrupted" and pushed.release_id in st["bad"]
    settled = [e for e in info["journal"] if e["event"] == "reconciled"][-1]
    assert settled["by"] == "guardian" and settled["outcome"] == "rolled-back" and settled["health"] == "ready"
    with HostConnection(host) as c2:
        server = ServerControl(c2).status()
    assert server["running"] and server["release"] == release

    # the tool that vanished never said what the guardian did: the next command that takes the lock says it, once
    said: list[str] = []
    with run_on_host(host, "ddtree-deploy server restart (test)", progress=said.append):
        pass
    told = [ln for ln in said if "its guardian settled it" in ln]
    assert len(told) == 1 and "rolled back" in told[0] and f"back on release {release}" in told[0], said
    again: list[str] = []
    with run_on_host(host, "ddtree-deploy server restart (test)", progress=again.append):
        pass
    assert not [ln for ln in again if "guardian settled" in ln], again


def _kill_guardian_unseen(run):
    """SIGKILL the run's guardian on the host and wait until the host calls its lock dead; the run's watch of the
    guardian's channel is slowed by the caller, so the run has not seen it (as when the kill lands between the last
    step and the end of the run)."""
    import time

    pid = run.mgr.show()["lock"]["holder_pid"]
    run.conn.run(f"kill -9 {pid}")
    deadline = time.monotonic() + 20
    while run.mgr.show()["lock_state"] != "dead" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run.mgr.show()["lock_state"] == "dead"
    return pid


def test_a_guardian_killed_after_the_last_step_leaves_no_dead_lock(good, monkeypatch):
    """The guardian dies after the run's last step, before the run's watch saw its channel close (the fault suite's
    guardian-killed at finish:start): its "release" goes unanswered. The run finds the lock still its own, recorded
    by that same guardian (pid and start time) and dead by the host's check: it takes it over, settles the host
    (nothing pending here), removes it and says so. A dead lock of the run that another holder recorded is left."""
    from ddtree_deploy import lease

    host, _, release = good
    monkeypatch.setattr(lease, "WATCH", 3600.0)  # the watch has not looked again by the end of the block
    said: list[str] = []
    with run_on_host(host, "ddtree-deploy server restart (test: guardian dies last)", progress=said.append) as run:
        pid = _kill_guardian_unseen(run)
    info = _show(host)
    assert info["lock"] is None and info["state"]["pending"] is None and info["state"]["active"] == release
    took = [e for e in info["journal"] if e["event"] == "lock-recovered"][-1]
    assert took["run"] == run.mgr.run_id and took["previous"]["holder_pid"] == pid
    told = [ln for ln in said if "removed the dead lock" in ln]
    assert len(told) == 1 and f"pid {pid}" in told[0] and "nothing was pending" in told[0], said

    # a dead lock of this run that names another holder is not provably its guardian's: it stays, and is reported
    said.clear()
    with run_on_host(host, "ddtree-deploy server restart (test: not its guardian)", progress=said.append) as run:
        pid = _kill_guardian_unseen(run)
        run.conn.run(f"sed -i 's/\"holder_pid\": {pid}/\"holder_pid\": {pid + 100000}/' {host.release_root}/lock")
    info = _show(host)
    try:
        assert info["lock"]["run_id"] == run.mgr.run_id and info["lock_state"] == "dead"
        assert not [e for e in info["journal"] if e["event"] == "lock-recovered" and e["run"] == run.mgr.run_id]
        assert [ln for ln in said if "did not answer the lock's release" in ln and "still held" in ln], said
    finally:
        with HostConnection(host) as conn:
            conn.run(f"rm -f {host.release_root}/lock")


def test_next_command_rolls_back_a_pending_switch_nobody_settled_and_says_so(good):
    host, inv, release = good
    left = _leave_pending(host, overlay(version="0.2.0-orphan"))
    proc = run_cli(inv, "server", "restart", host.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"found release {left} switched in by run" in said and "never probed" in said
    assert "the host rolled back" in said and f"back on release {release}" in said
    info = _show(host)
    assert info["state"]["active"] == release and info["state"]["pending"] is None and info["lock"] is None
    assert next(r for r in info["state"]["releases"] if r["id"] == left)["status"] == "interrupted"


def test_probe_keeps_a_pending_release_that_passes_and_says_so(good):
    """The server already runs the pending release (the run restarted it before it vanished): `probe` probes that
    and keeps it when it passes. (A pending release the server does not run is rolled back: test above.)"""
    host, inv, release = good
    left = _leave_pending(host, overlay(version="0.2.0-kept"), restarted=True)
    proc = run_cli(inv, "probe", host.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "probed it: it passes, so it stays active" in " ".join(proc.stderr.split())
    info = _show(host)
    st = info["state"]
    assert st["active"] == left and st["pending"] is None and info["lock"] is None
    assert next(r for r in st["releases"] if r["id"] == left)["status"] == "good"
    back = run_cli(inv, "rollback", host.name, "--to", release)
    assert back.returncode == 0, back.stdout + back.stderr


def test_steps_of_a_run_that_lost_its_lock_are_refused(good):
    host, _, release = good
    with HostConnection(host) as conn:
        first = ReleaseManager(conn, run_id="run-first")
        first.acquire("first")
        second = ReleaseManager(conn, run_id="run-second")
        with pytest.raises(LockHeld, match="another deploy is in progress: run run-first"):
            second.acquire("second")
        second.acquire("second", break_lock=True)  # its guardian is stopped first, so it cannot act later
        with pytest.raises(Fenced, match="run run-first no longer holds the deploy lock"):
            first.switch(release, probing=True)
        first.lease = None
        second.release_lock()
    assert _show(host)["lock"] is None


def test_every_write_command_takes_the_lock(good):
    host, inv, _ = good
    with HostConnection(host) as conn:
        holder = ReleaseManager(conn, run_id="run-holding")
        holder.acquire("ddtree-deploy apply --host t-tx (test)")
        try:
            for args in (["server", "stop", host.name], ["server", "restart", host.name], ["server", "start", host.name],
                         ["rollback", host.name], ["probe", host.name, "--record-baseline"]):
                proc = run_cli(inv, *args)
                assert proc.returncode == EXIT_LOCKED, (args, proc.stdout, proc.stderr)
                assert "another deploy is in progress: run run-holding" in " ".join(proc.stderr.split()), args
        finally:
            holder.release_lock()
        assert ServerControl(conn).status()["running"]  # nobody stopped it


def test_disk_full_at_the_lock_is_a_clear_error_and_leaves_no_lock_file(sandbox, tmp_path):
    host = standin_host(sandbox.base, "t-tx-full")
    inv = tmp_path / "hosts"
    write_host_yaml(host, inv)
    root = host.release_root
    with HostConnection(host) as conn:
        conn.run(f"mkdir -p {root} && mount -t tmpfs -o size=256k tmpfs {root} && mkdir {root}/releases {root}/base && "
                 f"fallocate -l $(( $(stat -f -c '%a*%S' {root}) )) {root}/.filler")
        try:
            with pytest.raises(OperationFailed, match=r"no space left on the release root .* while taking the host lock"):
                ReleaseManager(conn).acquire("test")
            proc = run_cli(inv, "server", "restart", host.name)
            assert proc.returncode == 1 and "Traceback" not in proc.stderr
            assert "no space left on the release root" in " ".join(proc.stderr.split())
            assert conn.run(f"ls -A {root}").text().split() == [".filler", "base", "releases"]  # no lock, no lock.*
        finally:
            conn.run(f"umount {root} && rmdir {root}")


def test_releases_warns_about_a_pending_switch(good):
    host, inv, release = good
    left = _leave_pending(host, overlay(version="0.2.0-warn"))
    proc = run_cli(inv, "releases", host.name)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert f"release {left} was switched in by run" in text and "never probed" in text
    assert json.loads(run_cli(inv, "releases", host.name, "--json").stdout)["state"]["pending"]["release"] == left
    assert run_cli(inv, "server", "restart", host.name).returncode == 0  # settles it
    assert _show(host)["state"]["active"] == release


def test_the_recap_keeps_the_rollback_target_of_a_cut_host(capsys):
    """A host whose run was cut and then settled by rolling back: the fleet's report carries where it went back to
    (not only inside a message the recap shortens), and the recap shows it."""
    from ddtree_deploy.commands.deploy import print_recap
    from ddtree_deploy.console import out
    from ddtree_deploy.errors import ConnectionCut
    from ddtree_deploy.fleet import _guarded

    target = "20261201T101010Z-feedbeef"

    def cut(host):
        exc = ConnectionCut(host.name, "the SSH connection was cut during probe; " + "x" * 200 + f"; back on release {target}")
        exc.outcome = {"action": "rolled-back", "release": "20261201T111111Z-0badcafe", "to": target}
        raise exc

    report = _guarded(cut, type("H", (), {"name": "gpu-7"})())
    assert report.status == "unreachable" and report.exit_code == 3
    assert report.rolled_back_to == target and report.went_back
    width, out.width = out.width, 200
    try:
        print_recap([report], [])
    finally:
        out.width = width
    assert target in capsys.readouterr().out
