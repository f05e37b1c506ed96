"""Releases on real sandbox hosts: hard-link copies, replaced (never written-through) files, byte-compiling by the
host's Python, atomic switch, state and journal, the lock, a cut link, a full disk, and cleanup."""

from __future__ import annotations

import dataclasses
import json
import shlex
import socket

import pytest

from ddtree_deploy.errors import DeployError
from ddtree_deploy.overlay import OverlayFile
from ddtree_deploy.hoststate import ReleaseState
from ddtree_deploy.release import BaseDrift, LockHeld, PushFailed, ReleaseManager
from ddtree_deploy.transport import HostConnection
from standin.helpers import overlay, remove_root, standin_host

pytestmark = pytest.mark.sandbox


@pytest.fixture
def host(sandbox, request):
    h = standin_host(sandbox.base, f"t-rel-{request.node.name[:40]}")
    yield h
    remove_root(h)


def _py(conn: HostConnection, code: str, env: str = "") -> str:
    return conn.run(f"{env} {conn.host.python} -c {shlex.quote(code)}").text().strip()


def test_push_switch_rollback_never_touch_installed_package(host):
    site = host.site_packages
    with HostConnection(host) as conn:
        # a real install carries bytecode; give the installed version.py some (removed again at the end) so we can
        # watch the release drop it while the installed copy stays as it was
        had_cache = conn.run(f"test -d {site}/sglang/__pycache__", check=False).ok
        conn.run(f"{host.python} -m py_compile {site}/sglang/version.py")
        try:
            _push_switch_rollback(conn, host)
        finally:
            conn.run(f"rm -f {site}/sglang/__pycache__/version.cpython-311.pyc"
                     + ("" if had_cache else f" && rmdir {site}/sglang/__pycache__"))


def _push_switch_rollback(conn: HostConnection, host) -> None:
    site = host.site_packages
    if True:
        mgr = ReleaseManager(conn)
        before = mgr.installed_manifest()
        ov = overlay()
        with mgr.locked("test"):
            pushed = mgr.push(ov)
            assert mgr.show()["state"]["active"] is None  # push never switches
            switched = mgr.switch(pushed.release_id)
        assert switched == {"from": None, "to": pushed.release_id, "previous_good": None,
                            "target": f"releases/{pushed.release_id}"}
        rel = f"{host.release_root}/releases/{pushed.release_id}"
        assert pushed.link_mode == "hardlink"
        # unchanged files are hard links to the installed ones; the patched file is a new inode
        same = conn.run(f"stat -c %i {site}/sglang/__init__.py {rel}/sglang/__init__.py").text().split()
        assert same[0] == same[1]
        diff = conn.run(f"stat -c %i {site}/sglang/version.py {rel}/sglang/version.py").text().split()
        assert diff[0] != diff[1]
        assert "ddtree overlay ok" in conn.run(f"cat {rel}/sglang/version.py").text()
        # stale bytecode of the replaced file is gone from the release; a fresh hash-checked one was compiled
        pycs = conn.run(f"ls {rel}/sglang/__pycache__/").text().split()
        assert [p for p in pycs if p.startswith("version.")] == ["version.cpython-311.pyc"]
        flags = conn.run(f"{host.python} -c \"import sys;d=open('{rel}/sglang/__pycache__/version.cpython-311.pyc','rb').read();"
                         "print(int.from_bytes(d[4:8],'little'))\"").text().strip()
        assert flags == "3"  # PEP 552: hash-based, checked
        record = json.loads(conn.run(f"cat {rel}/RELEASE.json").text())
        assert record["overlay_digest"] == ov.digest and record["patchset"] == "ddtree-test"
        assert record["overlay"]["sglang/version.py"]["sha256"] == dict((f.path, f.sha256) for f in ov.files)["sglang/version.py"]
        # the server's environment imports the release; importlib.metadata still answers from its dist-info
        env = f"PYTHONPATH={host.release_root}/current"
        origin = _py(conn, "import importlib.util,os;print(os.path.realpath(importlib.util.find_spec('sglang').origin))", env)
        assert origin == f"{rel}/sglang/__init__.py"
        assert _py(conn, "import importlib.metadata as m;print(m.version('sglang'))", env) == "0.5.11"
        assert conn.run(f"readlink {host.release_root}/current").text().strip() == f"releases/{pushed.release_id}"
        # back to "no overlay": current points at the empty base dir and sglang resolves to site-packages again
        mgr.switch(None, reason="rollback")
        origin = _py(conn, "import importlib.util,os;print(os.path.realpath(importlib.util.find_spec('sglang').origin))", env)
        assert origin == f"{site}/sglang/__init__.py"
        assert mgr.installed_manifest() == before
        events = [e["event"] for e in mgr.show(journal_lines=10)["journal"]]
        assert events == ["push", "switch", "switch"]


def test_syntax_error_fails_push_before_any_switch(host):
    bad = overlay(extra=(OverlayFile("sglang/srt/speculative/ddtree/tree.py", b"def broken(:\n    pass\n", action="add"),))
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        good = mgr.push(overlay())
        mgr.switch(good.release_id)
        with pytest.raises(PushFailed, match=r"sglang/srt/speculative/ddtree/tree.py does not compile"):
            mgr.push(bad)
        info = mgr.show()
        assert info["state"]["active"] == good.release_id
        assert [r["id"] for r in info["state"]["releases"]] == [good.release_id]
        assert conn.run(f"ls -A {host.release_root}/releases").text().split() == [good.release_id]
        assert conn.run(f"ls -A {host.release_root}/staging").text().split() == []


def test_replace_of_missing_file_is_refused(host):
    ov = overlay(extra=(OverlayFile("sglang/no_such_module.py", b"x = 1\n", action="replace"),))
    with HostConnection(host) as conn:
        with pytest.raises(PushFailed, match="no_such_module.py but the installed package has no such file"):
            ReleaseManager(conn).push(ov)


def test_lock_refuses_second_run_reports_stale_and_can_be_broken(host):
    with HostConnection(host) as conn:
        first = ReleaseManager(conn, run_id="run-one")
        second = ReleaseManager(conn, run_id="run-two")
        first.acquire("ddtree-deploy apply --host x")
        with pytest.raises(LockHeld, match=r"another deploy is in progress: run run-one by .*ddtree-deploy apply --host x"):
            second.acquire("ddtree-deploy apply")
        second.release_lock()  # not its lock: must not remove it
        assert second.show()["lock"]["run_id"] == "run-one"
        first.release_lock()
        # a lock left by a run whose process is gone is reported as stale, never silently taken over
        dead = {"run_id": "run-dead", "user": "root", "control_host": socket.gethostname(), "control_pid": 2 ** 22 + 7,
                "control_boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(), "command": "apply",
                "taken": "2026-01-01T00:00:00Z", "host_boot_id": "11111111-old-boot"}
        conn.run(f"cat > {host.release_root}/lock", stdin=json.dumps(dead).encode())
        with pytest.raises(LockHeld) as exc:
            second.acquire("ddtree-deploy apply")
        assert "run run-dead" in str(exc.value) and "that run is gone: the host has rebooted" in str(exc.value)
        assert "--break-lock" in str(exc.value)
        dead["host_boot_id"] = second.show()["boot_id"]  # same boot: the owner's pid is what tells it is gone
        conn.run(f"cat > {host.release_root}/lock", stdin=json.dumps(dead).encode())
        with pytest.raises(LockHeld, match=rf"that run is gone: pid {dead['control_pid']} no longer runs"):
            second.acquire("ddtree-deploy apply")
        got = second.acquire("ddtree-deploy apply", break_lock=True)
        assert got["broken"]["run_id"] == "run-dead"
        assert second.show(journal_lines=1)["journal"][0]["event"] == "lock-broken"
        second.release_lock()
        assert second.show()["lock"] is None


def test_ssh_cut_mid_push_leaves_old_release_and_installed_package(host):
    big = OverlayFile("sglang/srt/speculative/ddtree/blob.bin", bytes(range(256)) * 8192, action="add")  # 2 MiB
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        before = mgr.installed_manifest()
        good = mgr.push(overlay())
        mgr.switch(good.release_id)
    ov = overlay("crash", extra=(big,))
    conn = HostConnection(host)
    conn.open()
    mgr = ReleaseManager(conn)

    def cut_midway(chunks):
        for i, chunk in enumerate(chunks):
            if i == 4:
                conn.close()  # the link dies with the tar stream half sent
            yield chunk

    with pytest.raises(DeployError):
        mgr.push(ov, stream_filter=cut_midway, switch=True)
    with HostConnection(host) as conn2:
        mgr2 = ReleaseManager(conn2)
        info = mgr2.show()
        assert info["state"]["active"] == good.release_id
        assert info["current"] == f"releases/{good.release_id}"
        assert [r["id"] for r in info["state"]["releases"]] == [good.release_id]
        assert mgr2.installed_manifest() == before


def test_disk_full_on_release_root_is_a_clear_error_and_switches_nothing(sandbox):
    small = standin_host(sandbox.base, "ddtree-small")
    with HostConnection(small) as conn:
        conn.run(f"mkdir -p {small.release_root} && mount -t tmpfs -o size=2m tmpfs {small.release_root}")
        try:
            mgr = ReleaseManager(conn)
            before = mgr.installed_manifest()
            with pytest.raises(PushFailed, match=r"no space left on the release root /srv/ddtree-host/ddtree-small .*nothing was switched"):
                mgr.push(overlay())
            info = mgr.show()
            assert info["state"]["active"] is None and info["state"]["releases"] == [] and info["current"] is None
            assert conn.run(f"ls -A {small.release_root}/releases").text().split() == []
            assert mgr.installed_manifest() == before
        finally:
            conn.run(f"umount {small.release_root} && rmdir {small.release_root}")


def test_cleanup_keeps_newest_and_never_the_active_or_rollback_target(sandbox):
    h = dataclasses.replace(standin_host(sandbox.base, "t-rel-cleanup"), keep_releases=2)
    try:
        with HostConnection(h) as conn:
            mgr = ReleaseManager(conn)
            ids = []
            for i in range(4):
                ids.append(mgr.push(overlay(version=f"0.1.{i}")).release_id)
                if i == 0:
                    mgr.switch(ids[0])
                    mgr.mark(ids[0], "good")
            removed = mgr.cleanup()
            left = [r["id"] for r in mgr.show()["state"]["releases"]]
            assert ids[0] in left  # active
            assert removed == ids[1:3] and left == [ids[0], ids[3]]
            assert sorted(conn.run(f"ls {h.release_root}/releases").text().split()) == sorted(left)
    finally:
        remove_root(h)


def test_rollback_target_comes_from_recorded_state_not_directory_order():
    rel = lambda i, s: {"id": i, "status": s, "exists": True}  # noqa: E731
    state = {"releases": [rel("a", "good"), rel("b", "good"), rel("c", "pushed")], "previous_good": "a", "bad": []}
    assert ReleaseState.of(state).rollback_target("c") == "a"  # not "b", the newer directory
    assert ReleaseState.of({**state, "bad": ["a"]}).rollback_target("c") == "b"  # recorded target went bad: newest good
    assert ReleaseState.of({**state, "previous_good": None}).rollback_target("c") is None  # first overlay: installed


def test_rollback_on_a_full_disk_moves_current_first_and_needs_no_new_space(sandbox):
    """Issue #26 item 2: the disk fills after a probing switch. The rollback flips `current` (no new space), then
    records it with the space the switch held back (<root>/.reserve); the verdict after it still gets written. With
    no reserve left, the failure says which release `current` points at, and `current` has moved already."""
    h = standin_host(sandbox.base, "t-rel-fulldisk")
    root = h.release_root
    with HostConnection(h) as conn:
        conn.run(f"mkdir -p {root} && mount -t tmpfs -o size=256m tmpfs {root}")
        try:
            mgr = ReleaseManager(conn)
            with mgr.locked("test"):
                good = mgr.push(overlay(version="0.1.1"), switch=True)
                mgr.finish(good.release_id, "good", "apply")
                new = mgr.push(overlay(version="0.1.2"), switch=True)
                assert conn.run(f"stat -c %s {root}/.reserve").text().strip() == str(1 << 20)
                conn.run(f"fallocate -l $(( $(stat -f -c '%a*%S' {root}) )) {root}/.filler")
                assert conn.run(f"echo x > {root}/probe-write", check=False).exit_code != 0  # the disk is full
                back = mgr.roll_back(good.release_id, failed=new.release_id, note="probe failed", spec=None)
                assert back["to"] == good.release_id
                mgr.finish(good.release_id, "good", "apply", outcome="rolled-back")
            info = mgr.show(journal_lines=5)
            st = info["state"]
            assert info["current"] == f"releases/{good.release_id}" and st["active"] == good.release_id
            assert st["pending"] is None and new.release_id in st["bad"] and info["lock"] is None
            assert conn.run(f"test -e {root}/.reserve", check=False).exit_code != 0  # spent on the rollback's writes

            # no reserve and a full disk: the state write fails, but `current` moved first and the message says so
            conn.run(f"rm -f {root}/.filler")
            with mgr.locked("test"):
                again = mgr.push(overlay(version="0.1.3"), switch=True)
                conn.run(f"rm -f {root}/.reserve; fallocate -l $(( $(stat -f -c '%a*%S' {root}) )) {root}/.filler")
                with pytest.raises(DeployError, match=rf"no space left .*recording the rollback to {good.release_id}.*"
                                                      rf"the host is on release {good.release_id} \(`current`\)"):
                    mgr.roll_back(good.release_id, failed=again.release_id, note="probe failed", spec=None)
                assert mgr.show()["current"] == f"releases/{good.release_id}"
                conn.run(f"rm -f {root}/.filler")
        finally:
            conn.run(f"umount {root} && rmdir {root}", check=False)


def test_switch_hashes_the_replaced_files_again_and_names_a_late_hotfix(host):
    """Issue #26 item 5: a hotfix to a file the release replaces, landing after the build's drift check, stops the
    switch with the file named; the release that would have hidden it is removed; nothing was switched."""
    site = host.site_packages
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        sha = mgr.installed_manifest()["sglang/version.py"][0]
        conn.run(f"cp -p {site}/sglang/version.py {host.release_root}.version.py.bak || "
                 f"(mkdir -p $(dirname {host.release_root}) && cp -p {site}/sglang/version.py {host.release_root}.version.py.bak)")
        try:
            with mgr.locked("test"):
                pushed = mgr.push(overlay(), base_hashes={"sglang/version.py": sha})
                conn.run(f"echo '# hotfix on the host' >> {site}/sglang/version.py")
                with pytest.raises(BaseDrift, match=r"(?s)refusing to switch .*checked again right before the switch.*"
                                                   r"sglang/version.py: sha256 \w+ on the host"):
                    mgr.switch(pushed.release_id, probing=True)
            info = mgr.show()
            assert info["state"]["active"] is None and info["current"] is None and info["state"]["pending"] is None
            assert pushed.release_id not in [r["id"] for r in info["state"]["releases"]]
            assert conn.run(f"test -d {host.release_root}/releases/{pushed.release_id}", check=False).exit_code != 0
        finally:
            conn.run(f"cp -p {host.release_root}.version.py.bak {site}/sglang/version.py && rm {host.release_root}.version.py.bak")
