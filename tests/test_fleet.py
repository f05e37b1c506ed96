"""Fleet rollout over sandbox hosts: a failing canary stops the rollout before any other host is touched; after a
good canary the rest run in parallel; more failures than --max-fail stop new hosts; failed and skipped hosts go to
the retry file. Host copies share a sandbox sshd but have their own release roots and server ports, so each is an
independent deploy target."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from ddtree_deploy.deploy import deploy_overlay
from ddtree_deploy.errors import InputError
from ddtree_deploy.fleet import read_retry_file, rollout, write_retry_file
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.transport import HostConnection
from standin.helpers import install_standin, overlay, remove_root, standin_host

pytestmark = pytest.mark.sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy(base, name: str):
    h = standin_host(base, f"t-fleet-{name}")
    return dataclasses.replace(h, name=name, server=dict(h.server, port=_free_port()))


@pytest.fixture
def fleet(sandbox):
    hosts = [_copy(sandbox.base, "a"), _copy(sandbox.drift, "b"), _copy(sandbox.base, "c")]
    install_standin(hosts[0])
    install_standin(hosts[1])
    yield hosts
    for h in hosts:
        remove_root(h)


def _releases(host) -> list[str]:
    with HostConnection(host) as conn:
        return [r["id"] for r in ReleaseManager(conn).show()["state"]["releases"]]


def test_failing_canary_stops_the_rollout_and_good_canary_lets_the_rest_run_in_parallel(fleet, tmp_path):
    a, b, c = fleet
    modes = {"a": None, "b": None, "c": "crash"}
    action = lambda h: deploy_overlay(h, overlay(modes[h.name], base_version="0.5.23" if h.name == "b" else "0.5.11"),  # noqa: E731
                                      record_baseline=False)
    first = rollout([c, a, b], action, max_parallel=2)
    assert first.aborted.startswith("canary c failed (rolled-back)")
    assert [r.host for r in first.reports] == ["c"] and first.skipped == ["a", "b"] and first.exit_code == 1
    assert _releases(a) == [] and _releases(b) == []  # not touched
    retry = write_retry_file(first, tmp_path / "retry")
    assert read_retry_file(retry) == ["c", "a", "b"]
    second = rollout([a, b], action, max_parallel=2)
    assert second.exit_code == 0 and not second.skipped and [r.status for r in second.reports] == ["ok", "ok"]
    assert len(_releases(a)) == 1 and len(_releases(b)) == 1
    assert write_retry_file(second, retry) is None and not retry.exists()


def test_more_failures_than_max_fail_stop_new_hosts(sandbox):
    down = [dataclasses.replace(sandbox.base, name=f"down{i}", port=_free_port(), connect_timeout=2.0) for i in range(4)]
    result = rollout(down, lambda h: deploy_overlay(h, overlay()), max_parallel=1, max_fail=1, canary=False)
    assert [r.status for r in result.reports] == ["unreachable", "unreachable"]  # 2 > 1: no third host started
    assert result.skipped == ["down2", "down3"]
    assert "more than --max-fail 1" in result.aborted
    assert result.exit_code == 3
    assert "cannot connect" in result.reports[0].message


def test_bad_fleet_arguments_are_input_errors(sandbox):
    with pytest.raises(InputError, match="no hosts selected"):
        rollout([], lambda h: None)
    with pytest.raises(InputError, match="--max-parallel must be at least 1"):
        rollout([sandbox.base], lambda h: None, max_parallel=0)
