"""The release root as the control side knows it (``ddtree_deploy.hoststate``): the layout is the one the host side
writes (``remote/``, driven here in process against a temp root), and ``ReleaseState`` reads the state it reports."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from ddtree_deploy.hoststate import HostLayout, ReleaseState
from ddtree_deploy.inventory import Host
from ddtree_deploy.probe import expected_sglang_dir
from ddtree_deploy.remote import _build, _state, release, server
from ddtree_deploy.server import managed_paths


def _built(tmp_path: Path, rid: str, run: str) -> tuple[str, str]:
    """A release root under ``tmp_path`` with release ``rid`` built by the host side; (root, site-packages)."""
    root, site = tmp_path / "ddtree", tmp_path / "site-packages"
    if not site.exists():
        (site / "sglang").mkdir(parents=True)
        (site / "sglang" / "__init__.py").write_text("")
        (site / "sglang" / "version.py").write_text('__version__ = "0.5.0"\n')
    layout = HostLayout(str(root))
    text = f'__version__ = "0.5.0+{rid}"\n'
    staged = Path(layout.staging(run), "sglang", "version.py")
    staged.parent.mkdir(parents=True)
    staged.write_text(text)
    entry = {"path": "sglang/version.py", "sha256": hashlib.sha256(text.encode()).hexdigest(), "mode": 0o644,
             "action": "replace"}
    base = {"sglang/version.py": hashlib.sha256((site / "sglang" / "version.py").read_bytes()).hexdigest()}
    _build.build(str(root), str(site), "sglang", rid, layout.staging(run), [entry], {"run_id": run},
                 base_hashes=base)
    return str(root), str(site)


def test_the_layout_is_where_the_host_side_writes(tmp_path: Path) -> None:
    root, site = _built(tmp_path, "r1", "run-1")
    _built(tmp_path, "r2", "run-2")
    layout = HostLayout(root)
    release.switch(root, "r1", run_id="run-1")
    release.switch(root, "r2", run_id="run-2", probing=True)
    assert os.path.realpath(layout.current) == os.path.realpath(layout.release("r2"))
    assert os.path.isfile(os.path.join(layout.release_package("r2"), "version.py"))
    assert json.loads(Path(layout.state).read_text())["pending"]["release"] == "r2"
    assert [json.loads(line)["event"] for line in Path(layout.journal).read_text().splitlines()][:2] == ["push", "push"]
    assert not os.path.exists(layout.staging("run-1")), "the build consumed what was staged where the control side put it"
    release.switch(root, None, run_id="run-3")
    assert os.path.realpath(layout.current) == os.path.realpath(layout.base) and os.listdir(layout.base) == []
    # the server's files and the baseline, named by the host side's own helpers
    assert server._paths(root) == (layout.server, layout.server_pid, layout.server_log)
    assert server._launch_path(root) == layout.launch_record
    assert not _state._has_baseline(root)
    Path(layout.baseline).write_text("{}")
    assert _state._has_baseline(root)
    # and the control side's paths are the layout's
    host = Host(name="h", source="<test>", python="/usr/bin/python3", site_packages=site, release_root=root)
    assert (managed_paths(host).log, managed_paths(host).pid_file) == (layout.server_log, layout.server_pid)
    assert expected_sglang_dir(host, "r2") == layout.release_package("r2")
    assert HostLayout.of(host) == layout and layout.lock == os.path.join(root, "lock")


def test_release_state_reads_what_the_host_reports(tmp_path: Path) -> None:
    root, _ = _built(tmp_path, "r1", "run-1")
    _built(tmp_path, "r2", "run-2")
    release.switch(root, "r1", run_id="run-1")
    release.finish(root, "r1", "good", 5, "run-1", "apply", {})
    release.switch(root, "r2", run_id="run-2", probing=True)
    st = ReleaseState.of(release.show(root)["state"])
    assert st.ids == ("r1", "r2") and st.active == "r2" and st.previous_good == "r1"
    assert st.active_release["id"] == "r2" and st.release("nope") is None and st.release(None) is None
    assert st.pending_run == "run-2" and st.pending["safe"] == "r1"
    assert st.is_good("r1") and not st.is_good("r2") and not st.is_bad("r1")
    assert st.rollback_target("r2") == "r1"
    release.roll_back(root, "r1", failed="r2", run_id="run-2", note="probe failed")
    after = ReleaseState.of(release.show(root)["state"])
    assert after.active == "r1" and after.is_bad("r2") and "r2" in after.bad
    assert after.raw["active"] == "r1", "the dict as it came, for --json"


def test_release_state_is_a_read_only_view_with_the_hosts_defaults() -> None:
    empty = ReleaseState.of({})
    assert (empty.releases, empty.active, empty.previous_good, empty.bad, empty.pending) == ((), None, None,
                                                                                              frozenset(), None)
    assert empty.rollback_target(None) is None and empty.pending_run is None
    state = {"releases": [{"id": "a", "status": "interrupted"}], "active": "a", "bad": [], "pending": {"run": "x"}}
    st = ReleaseState.of(state)
    assert st.is_bad("a"), "an interrupted release is not gone back to without --force"
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.active = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        st.releases[0]["status"] = "good"  # type: ignore[index]
    state["releases"][0]["status"] = "good"
    assert st.is_bad("a"), "a copy: the host's reply changing later does not change the view"
