"""The probe's stage list (``ddtree_deploy.probe``): ``check_release`` and ``check_serving`` are read off it, and what
one stage tells the next travels in a ``ProbeRun``. Run for real on this machine (``connection: local``: the host
side's probe ops in a subprocess of this Python) against a tiny installed ``sglang`` and a release built by the host
side in a temp root; no server runs, so the serving stages fail at start-up, as they would on a host."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from ddtree_deploy.hoststate import HostLayout
from ddtree_deploy.inventory import Host
from ddtree_deploy.probe import STAGE_MODULES, STAGES, Prober, ProbeRun, RUNTIME_SUBDIR
from ddtree_deploy.remote import _build, release
from ddtree_deploy.transport import connect


def _host(tmp_path: Path) -> Host:
    site = tmp_path / "site-packages"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text('__version__ = "0.5.0"\n')
    return Host(name="here", source=str(tmp_path / "here.yaml"), python=sys.executable, site_packages=str(site),
                release_root=str(tmp_path / "ddtree"), connection="local", command_timeout=60.0,
                server={"kind": "managed", "port": 1, "env": {"PYTHONPATH": str(site)}})


def _release_with_runtime(host: Host, rid: str) -> None:
    """A release whose overlay adds the DDTree runtime package (its ``__version__`` only), built and switched in by
    the host side."""
    layout = HostLayout.of(host)
    path = f"sglang/{RUNTIME_SUBDIR}/__init__.py"
    text = '__version__ = "9.9.9"\n'
    staged = Path(layout.staging("run-1"), path)
    staged.parent.mkdir(parents=True)
    staged.write_text(text)
    entry = {"path": path, "sha256": hashlib.sha256(text.encode()).hexdigest(), "mode": 0o644, "action": "add"}
    _build.build(host.release_root, host.site_packages, "sglang", rid, layout.staging("run-1"), [entry],
                 {"run_id": "run-1"}, base_hashes={})
    release.switch(host.release_root, rid, run_id="run-1")


def test_the_stage_list_and_which_stages_need_the_server() -> None:
    assert STAGES == ("overlay", "selftest", "startup", "generation")
    assert [m.NEEDS_SERVER for m in STAGE_MODULES] == [False, False, True, True]


def test_check_release_runs_the_stages_without_a_server_and_hands_the_runtime_on(tmp_path: Path) -> None:
    host = _host(tmp_path)
    with connect(host) as conn:
        installed = Prober(conn).check_release(None)
        assert [(s.name, s.status) for s in installed] == [("overlay", "pass"), ("selftest", "skip")]
        assert installed[0].detail.startswith("no overlay active: sglang from the installed package")
        assert installed[1].detail == "no DDTree runtime active"

        _release_with_runtime(host, "r1")
        checked = Prober(conn, facts={"gpus": []}).check_release("r1")
        assert [(s.name, s.status) for s in checked] == [("overlay", "pass"), ("selftest", "skip")]
        assert checked[0].detail == "sglang from release r1; DDTree runtime 9.9.9"
        # the overlay stage found the runtime (its ProbeRun said so), so the self-test looked for a GPU
        assert checked[1].detail == "skipped: no GPU on this host (the host's facts list no GPU)"
        alone = Prober(conn, facts={"gpus": []}).selftest("r1")
        assert alone.detail == "no DDTree runtime active", "a stage run alone starts from an empty ProbeRun"

        # the serving stages come after, from the same list: no server runs, so start-up fails and the rest is not run
        result = Prober(conn).check_serving("r1", checked)
        assert [(s.name, s.status) for s in result.stages] == [
            ("overlay", "pass"), ("selftest", "skip"), ("startup", "fail"), ("generation", "not-run")]
        assert "not running" in result.stages[2].detail and not result.ok and result.ddtree == {}

        broken = Prober(conn).check_serving("r1", [checked[0].__class__("overlay", "fail", 0.0, "x")])
        assert [s.status for s in broken.stages] == ["fail", "not-run", "not-run"], "nothing runs after a failure"


def test_a_probe_run_starts_empty() -> None:
    ctx = ProbeRun()
    assert (ctx.prefetch, ctx.runtime_present, ctx.gpu_info, ctx.generation, ctx.replies) == (False, False, None,
                                                                                                None, None)
