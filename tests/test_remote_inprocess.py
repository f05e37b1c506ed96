"""The host side of the deploy transaction, run in this process: ``ddtree_deploy.remote``'s release modules imported
like any module and driven against a release root in a temp directory (real files, real hard links, the real lock
and journal), each step in milliseconds. What only a real connection can show (a cut link, a killed sshd, a full
disk, the guardian on its own channel) stays with the sandbox tests (test_release.py, test_transaction.py,
test_faults.py).

The steps: build (receive's second half), switch (plain and probing: `pending` first), roll back, the verdict
(finish), the fence and the lock, and settling a run that stopped early (the guardian's ``_abandon``)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from ddtree_deploy.remote import _build, _lease, _state, release, server
from ddtree_deploy.remote._frame import Failure

INSTALLED = {
    "sglang/__init__.py": "from .version import __version__\n",
    "sglang/version.py": '__version__ = "0.5.0"\n',
    "sglang/srt/server_args.py": "SPECULATIVE = ('EAGLE',)\n",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Host:
    """A release root and an installed package under ``tmp``, and the overlays pushed onto it."""

    def __init__(self, tmp: Path) -> None:
        self.root = str(tmp / "ddtree")
        self.site = tmp / "site-packages"
        for rel, text in INSTALLED.items():
            path = self.site / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        dist = self.site / "sglang-0.5.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.0\n\n")

    def stage(self, rid: str, files: dict[str, str]) -> tuple[str, list[dict]]:
        """The overlay ``files`` ({path: text}) staged as receive leaves it, and their entries for build."""
        staging = os.path.join(self.root, "staging", rid)
        entries = []
        for rel, text in files.items():
            path = Path(staging, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            action = "replace" if (self.site / rel).exists() else "add"
            entries.append({"path": rel, "sha256": _sha(text.encode()), "mode": 0o644, "action": action})
        return staging, entries

    def build(self, rid: str, files: dict[str, str] | None = None, run: str = "run-1", fence: str | None = None,
              **kw):
        files = files or {"sglang/version.py": f'__version__ = "0.5.0+{rid}"\n'}
        staging, entries = self.stage(rid, files)
        base = {rel: _sha((self.site / rel).read_bytes()) for rel in files if (self.site / rel).exists()}
        meta = {"run_id": run, "patchset": "ddtree", "base_version": "0.5.0", "base_snapshot": "snap-1"}
        return _build.build(self.root, str(self.site), "sglang", rid, staging, entries, meta,
                            base_hashes=kw.pop("base_hashes", base), fence=fence, **kw)

    def state(self) -> dict:
        return json.loads(Path(self.root, "state.json").read_text())

    def current(self) -> str | None:
        return _state._current_target(self.root)

    def journal(self) -> list[dict]:
        path = Path(self.root, "journal.log")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def lock(self, run: str) -> dict:
        """The lock taken for ``run`` as ``hold`` takes it (this process is its holder)."""
        _state._ensure_root(self.root)
        got = _lease._take_lock(self.root, {"run_id": run, "command": "test"}, False)
        assert got["acquired"], got
        return got


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


# -- build ------------------------------------------------------------------------------------------------------------
def test_build_links_the_installed_package_and_replaces_only_the_overlay_files(host: Host) -> None:
    before = {rel: (host.site / rel).stat() for rel in INSTALLED}
    out = host.build("r1")
    rel_dir = Path(host.root, "releases", "r1")
    assert out["link_mode"] == "hardlink" and out["files"] == 1 and out["base_drift"] == []
    for rel, st in before.items():
        now = (host.site / rel).stat()
        assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)  # untouched
        linked = (rel_dir / rel).stat()
        if rel == "sglang/version.py":  # replaced: a new file, never written through the link
            assert linked.st_ino != st.st_ino and (rel_dir / rel).read_text() == '__version__ = "0.5.0+r1"\n'
        else:
            assert linked.st_ino == st.st_ino and now.st_nlink == 2
    assert (rel_dir / "sglang-0.5.0.dist-info" / "METADATA").stat().st_ino == \
        (host.site / "sglang-0.5.0.dist-info" / "METADATA").stat().st_ino
    assert list((rel_dir / "sglang" / "__pycache__").glob("version.*.pyc"))  # compiled by this interpreter
    record = json.loads((rel_dir / "RELEASE.json").read_text())
    assert record["compiled_by"] == sys.executable
    assert record["switch_check"]["files"] == [{"path": "sglang/version.py", "action": "replace"}]
    state = host.state()
    assert [(r["id"], r["status"], r["run"]) for r in state["releases"]] == [("r1", "pushed", "run-1")]
    assert state["active"] is None and host.current() is None  # a build never switches
    assert [e["event"] for e in host.journal()] == ["push"]
    assert not Path(host.root, "staging", "r1").exists()
    assert not [p for p in os.listdir(Path(host.root, "releases")) if p.startswith(".partial-")]


@pytest.mark.parametrize("case, kind, words", [
    ("corrupt", "transfer", "transfer corrupted"),
    ("drift", "drift", "changed since snapshot snap-1"),
    ("syntax", "syntax", "does not compile"),
    ("missing", "mismatch", "no such file"),
    ("exists", "exists", "already exists"),
])
def test_a_refused_build_leaves_no_release_and_state_as_it_was(host: Host, case: str, kind: str, words: str) -> None:
    host.build("r0")
    state0, journal0 = host.state(), host.journal()
    rid, files, kw = "r1", None, {}
    if case == "corrupt":
        staging, entries = host.stage("r1", {"sglang/version.py": "x = 1\n"})
        Path(staging, "sglang/version.py").write_text("x = 2\n")  # what a cut or corrupted transfer leaves
        with pytest.raises(Failure) as err:
            _build.build(host.root, str(host.site), "sglang", "r1", staging, entries, {})
    else:
        if case == "drift":
            kw["base_hashes"] = {"sglang/version.py": _sha(b"what the snapshot had\n")}
        elif case == "syntax":
            files = {"sglang/version.py": "def broken(:\n"}
        elif case == "missing":
            staging, entries = host.stage("r1", {"sglang/gone.py": "x = 1\n"})
            entries[0]["action"] = "replace"
            with pytest.raises(Failure) as err:
                _build.build(host.root, str(host.site), "sglang", "r1", staging, entries, {})
        elif case == "exists":
            rid = "r0"
        if case != "missing":
            with pytest.raises(Failure) as err:
                host.build(rid, files, **kw)
    assert err.value.kind == kind and words in str(err.value)
    assert host.state() == state0 and host.journal() == journal0
    assert sorted(os.listdir(Path(host.root, "releases"))) == ["r0"]  # no partial release left behind
    if case != "exists":
        assert not Path(host.root, "staging", "r1").exists()


def test_a_build_of_a_run_that_lost_its_lock_is_not_committed(host: Host) -> None:
    host.lock("run-2")
    with pytest.raises(Failure) as err:
        host.build("r1", fence="run-1")
    assert err.value.kind == "fenced" and "held by run run-2" in str(err.value)
    assert not Path(host.root, "releases", "r1").exists() and not Path(host.root, "state.json").exists()


# -- switch, verdict, roll back -----------------------------------------------------------------------------------------
def test_switch_moves_current_and_state_follows(host: Host) -> None:
    host.build("r1")
    got = release.switch(host.root, "r1", run_id="run-1")
    assert got == {"from": None, "to": "r1", "previous_good": None, "target": "releases/r1"}
    assert host.current() == "releases/r1" and host.state()["active"] == "r1"
    # `current` is the truth: a state.json that lags behind it (a crash between the two writes) is read through it
    os.replace(os.path.join(host.root, "current"), os.path.join(host.root, ".saved"))
    os.symlink("base", os.path.join(host.root, "current"))
    assert _state._load_state(host.root)["active"] is None
    with pytest.raises(Failure, match="no release nope on this host"):
        release.switch(host.root, "nope")


def test_a_probing_switch_writes_pending_first_and_the_verdict_clears_it(host: Host) -> None:
    host.build("r1")
    release.switch(host.root, "r1", run_id="run-1")
    release.finish(host.root, "r1", "good", keep=5, run_id="run-1", event="deploy", fields={})
    host.build("r2", run="run-2")
    release.switch(host.root, "r2", run_id="run-2", probing=True)
    state = host.state()
    assert state["pending"]["release"] == "r2" and state["pending"]["safe"] == "r1"
    assert state["pending"]["stage"] == "switched" and state["pending"]["run"] == "run-2"
    assert state["previous_good"] == "r1" and host.current() == "releases/r2"
    assert _state._release(state, "r2")["status"] == "probing"
    assert os.path.getsize(os.path.join(host.root, ".reserve")) == _state.RESERVE_BYTES  # for the verdict's writes
    release.finish(host.root, "r2", "good", keep=5, run_id="run-2", event="deploy", fields={"ok": True})
    state = host.state()
    assert state["pending"] is None and _state._release(state, "r2")["status"] == "good"
    assert [e["event"] for e in host.journal()][-2:] == ["mark", "deploy"]


def test_a_probing_switch_hashes_the_replaced_files_again_and_removes_a_release_a_hotfix_outdated(host: Host) -> None:
    host.build("r1")
    (host.site / "sglang/version.py").write_text('__version__ = "0.5.0.post1"\n')  # a hotfix lands after the build
    with pytest.raises(Failure) as err:
        release.switch(host.root, "r1", run_id="run-1", probing=True)
    assert err.value.kind == "drift" and "sglang/version.py" in str(err.value)
    assert host.current() is None and host.state()["releases"] == [] and host.state()["pending"] is None
    assert not Path(host.root, "releases", "r1").exists()


def test_roll_back_moves_current_first_marks_the_failed_release_and_keeps_pending_until_the_verdict(host: Host) -> None:
    host.build("r1")
    release.switch(host.root, "r1", run_id="run-1")
    release.mark(host.root, "r1", "good")
    host.build("r2", run="run-2")
    release.switch(host.root, "r2", run_id="run-2", probing=True)
    got = release.roll_back(host.root, "r1", failed="r2", run_id="run-2", note="probe: /health 500")
    assert got == {"from": "r2", "to": "r1", "restarted": None}
    state = host.state()
    assert host.current() == "releases/r1" and state["active"] == "r1"
    assert state["bad"] == ["r2"] and _state._release(state, "r2")["note"] == "probe: /health 500"
    assert state["pending"] == {**state["pending"], "release": "r1", "safe": "r1", "stage": "rolling-back", "from": "r2"}
    release.finish(host.root, "r1", "good", keep=5, run_id="run-2", event="rollback", fields={})
    assert host.state()["pending"] is None
    with pytest.raises(Failure, match="cannot roll back to nope"):
        release.roll_back(host.root, "nope")
    assert host.current() == "releases/r1"


def test_cleanup_keeps_the_newest_and_never_the_active_the_rollback_target_or_another_runs_release(host: Host) -> None:
    for i in range(1, 5):
        host.build(f"r{i}", run=f"run-{i}")
    release.switch(host.root, "r1")
    release.mark(host.root, "r1", "good")
    release.switch(host.root, "r2")  # r1 becomes the rollback target
    assert release.cleanup(host.root, keep=3) == {"removed": ["r3"]}  # the oldest that may go
    assert sorted(os.listdir(Path(host.root, "releases"))) == ["r1", "r2", "r4"]
    with pytest.raises(Failure) as err:
        release.discard_release(host.root, "r4", "run-9", "launch refused")
    assert err.value.kind == "protected"
    assert release.discard_release(host.root, "r4", "run-4", "launch refused") == {"removed": True}
    assert [r["id"] for r in host.state()["releases"]] == ["r1", "r2"]


# -- the lock and the fence ---------------------------------------------------------------------------------------------
def test_the_fence_admits_the_lock_holders_steps_only(host: Host) -> None:
    host.build("r1")
    assert release.switch(host.root, "r1", fence=None)["to"] == "r1"  # outside any run: no fence
    with pytest.raises(Failure, match="no lock"):
        release.switch(host.root, None, fence="run-1")
    got = host.lock("run-1")
    assert got["recovered"] is None and got["broken"] is None
    assert _lease._lock_state(_lease._read_lock(host.root)) == "live"  # held by this process, which runs
    assert release.switch(host.root, None, fence="run-1")["to"] is None
    with pytest.raises(Failure) as err:
        release.switch(host.root, "r1", fence="run-2")
    assert err.value.kind == "fenced" and "held by run run-1" in str(err.value)
    second = _lease._take_lock(host.root, {"run_id": "run-2"}, False)
    assert not second["acquired"] and second["holder"]["run_id"] == "run-1" and second["lock_state"] == "live"
    assert _lease._unlock(host.root, "run-2") == {"released": False, "reason": "held by run-1"}
    assert _lease._unlock(host.root, "run-1") == {"released": True}


def test_a_lock_whose_holder_is_gone_is_taken_over_and_its_steps_are_refused(host: Host) -> None:
    host.lock("run-1")
    rec = _lease._read_lock(host.root)
    rec["holder_ticks"] = -1  # the holder's pid now names another process (or none): the holder is gone
    Path(host.root, "lock").write_text(json.dumps(rec))
    with pytest.raises(Failure, match="lost the deploy lock"):
        release.mark(host.root, "r1", "good", fence="run-1")
    got = _lease._take_lock(host.root, {"run_id": "run-2"}, False)
    assert got["acquired"] and got["recovered"]["run_id"] == "run-1" and "is gone" in got["recovered_why"]
    assert _lease._read_lock(host.root)["run_id"] == "run-2"
    assert host.journal()[-1]["event"] == "lock-recovered"


def test_the_guardian_reads_heartbeats_and_its_closing_commands(host: Host) -> None:
    def commands(data: bytes | None, timeout: float = 5.0):
        r, w = os.pipe()
        try:
            if data is not None:
                os.write(w, data)
            if data is None or not data.endswith(b"\n"):
                os.close(w)
                w = -1
            return _lease._read_commands(timeout, fd=r)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)

    assert commands(b"hb\nhb\nrelease\n") == (None, False)
    assert commands(b"hb\nabandon interrupted (Ctrl-C)\n") == ("interrupted (Ctrl-C)", True)
    assert commands(b"hb\nhb") == ("the control side's connection closed (end of input)", False)
    t0 = time.monotonic()
    r, w = os.pipe()
    try:
        assert _lease._read_commands(0.15, fd=r) == ("no heartbeat from the control side for 0 s", False)
    finally:
        os.close(r)
        os.close(w)
    assert 0.15 <= time.monotonic() - t0 < 2


# -- settling a run that stopped early ---------------------------------------------------------------------------------
def test_settling_an_interrupted_run_rolls_back_to_the_safe_release_and_removes_its_leftovers(host: Host) -> None:
    host.build("r1")
    release.switch(host.root, "r1", run_id="run-1")
    release.finish(host.root, "r1", "good", keep=5, run_id="run-1", event="deploy", fields={})
    host.lock("run-2")
    host.build("r2", run="run-2", fence="run-2")
    host.build("r3", run="run-2", fence="run-2")  # pushed by the run, never switched to
    release.switch(host.root, "r2", run_id="run-2", probing=True, fence="run-2")
    host.stage("run-2", {"sglang/version.py": "half a transfer\n"})
    os.makedirs(os.path.join(host.root, "releases", ".partial-r4"))
    out = _lease._abandon(host.root, "run-2", "the control side's connection closed (end of input)", guard=None)
    assert out["action"] == "rolled-back" and out["release"] == "r2" and out["to"] == "r1"
    assert out["removed"] == ["r3"] and out["restarted"] is False
    state = host.state()
    assert host.current() == "releases/r1" and state["active"] == "r1" and state["pending"] is None
    assert _state._release(state, "r2")["status"] == "interrupted" and "r2" in state["bad"]
    assert sorted(os.listdir(Path(host.root, "releases"))) == ["r1", "r2"]
    assert not Path(host.root, "staging", "run-2").exists()
    assert _lease._read_lock(host.root) is None  # released once settled
    events = [(e["event"], e.get("by")) for e in host.journal()]
    assert ("abandon", None) in events and events[-1] == ("reconciled", "guardian")
    # the next run hears of it once (the tool that was cut off never did)
    assert _lease._untold_settlement(host.root, "run-3")["run"] == "run-2"
    assert _lease._untold_settlement(host.root, "run-3") is None


def test_a_run_that_ended_with_nothing_pending_only_releases_the_lock(host: Host) -> None:
    host.lock("run-1")
    host.build("r1", run="run-1", fence="run-1")
    release.switch(host.root, "r1", run_id="run-1", fence="run-1")
    out = _lease._abandon(host.root, "run-1", "abandoned by the control side", guard=None, told=True)
    assert out["action"] == "none" and out["to"] == "r1" and host.current() == "releases/r1"
    assert _lease._read_lock(host.root) is None
    assert _lease._untold_settlement(host.root, "run-2") is None  # the tool that asked said it itself


def test_reconcile_settles_a_pending_switch_left_by_a_run_that_is_gone(host: Host) -> None:
    host.build("r1", run="run-1")
    release.switch(host.root, "r1", run_id="run-1", probing=True)  # the run died here, nobody settled it
    assert release.reconcile(host.root, "run-2", "left by a run that is gone")["action"] == "rolled-back"
    assert host.current() == "base" and host.state()["pending"] is None
    assert release.reconcile(host.root, "run-2", "again") == {"action": "none"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settling_a_run_that_restarted_the_server_restarts_it_on_the_safe_release(host: Host, tmp_path: Path) -> None:
    port = _free_port()
    command = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}"
    spec = {"kind": "managed", "command_on": command, "command_off": command, "env": {}, "port": port,
            "stop_timeout": 5.0}
    _, pid_file, log_file = server._paths(host.root)
    guard = dict(spec, pid_source={"kind": "file", "path": pid_file}, log_source={"kind": "file", "path": log_file},
                 health_url=f"http://127.0.0.1:{port}/", startup_timeout=20.0)
    host.build("r1")
    release.switch(host.root, "r1", run_id="run-1")
    release.finish(host.root, "r1", "good", keep=5, run_id="run-1", event="deploy", fields={})
    try:
        host.lock("run-2")
        host.build("r2", run="run-2", fence="run-2")
        release.switch(host.root, "r2", run_id="run-2", probing=True, fence="run-2")
        started = release.server_action(host.root, spec, "start", release="r2", fence="run-2")
        assert host.state()["pending"]["server_touched"] and host.state()["pending"]["stage"] == "probing"
        assert server._read_pid(pid_file)["release"] == "r2"
        out = _lease._abandon(host.root, "run-2", "no heartbeat from the control side for 30 s", guard=guard)
        assert out["action"] == "rolled-back" and out["restarted"] is True and out["health"]["state"] == "ready"
        record = server._read_pid(pid_file)
        assert record["release"] == "r1" and record["pid"] != started["pid"] and server._alive(record)
        assert json.loads(Path(server._launch_path(host.root)).read_text())["release"] == "r1"
    finally:
        server.stop(host.root, wait=5.0)
    assert not server._alive(server._read_pid(pid_file))
