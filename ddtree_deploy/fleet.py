"""Rolling a deploy over several hosts: a canary first, then the rest in parallel, with a failure threshold.

Rules (after Ansible's ``serial``/``max_fail_percentage`` and the GitLab incident where a play kept draining nodes
because it only stopped when *every* host failed): the canary must pass before any other host is touched; after
that at most ``max_parallel`` hosts run at once, and once more than ``max_fail`` hosts have failed no new host is
started (the threshold is exceeded, not equalled); hosts already running finish. Every host gets a line in the
recap; failed and skipped hosts are written to a retry file for ``--retry-failed``.

A host whose SSH connection could not be opened at all (refused, reset, timed out, no banner: ``ConnectFailed``,
so nothing ran there) is tried once more after ``CONNECT_RETRY_WAIT`` seconds (tenacity), like a node whose sshd
comes up a moment late; an authentication, host-key or name failure is not (waiting does not fix it).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import tenacity

from .deploy import ApplyReport
from .errors import ConnectFailed, DeployError, EXIT_FAILED, EXIT_OK, InputError
from .inventory import Host

DEFAULT_RETRY_FILE = Path("ddtree-deploy.retry")
CONNECT_RETRY_WAIT = 3.0  # seconds before the one retry of a host whose connection could not be opened


@dataclass
class FleetResult:
    reports: list[ApplyReport]
    skipped: list[str] = field(default_factory=list)
    aborted: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> list[str]:
        return [r.host for r in self.reports if not r.ok]

    @property
    def exit_code(self) -> int:
        codes = {r.exit_code for r in self.reports if not r.ok}
        if not codes and not self.skipped:
            return EXIT_OK
        return codes.pop() if len(codes) == 1 else EXIT_FAILED

    def to_dict(self) -> dict:
        return {"ok": self.exit_code == EXIT_OK, "exit_code": self.exit_code, "aborted": self.aborted,
                "seconds": round(self.seconds, 3), "failed": self.failed, "skipped": self.skipped,
                "hosts": [r.to_dict() for r in self.reports]}


def _guarded(action: Callable[[Host], ApplyReport], host: Host,
             progress: Callable[[str], None] = lambda m: None) -> ApplyReport:
    """A refusal before any change (lock held, ABI, unreachable) becomes a failed report, not a crash of the fleet.
    A connection that could not be opened is retried once (the module docstring says why that is safe)."""
    t = time.monotonic()

    def again(state: tenacity.RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        progress(f"{host.name}: {failure}; trying once more in {CONNECT_RETRY_WAIT:g} s")

    once_more = tenacity.Retrying(retry=tenacity.retry_if_exception_type(ConnectFailed), stop=tenacity.stop_after_attempt(2),
                                  wait=tenacity.wait_fixed(CONNECT_RETRY_WAIT), before_sleep=again, reraise=True)
    try:
        return once_more(action, host)
    except DeployError as exc:
        status = "unreachable" if exc.exit_code == 3 else "refused"
        # a cut or interrupted run carries how its host was settled: the recap keeps where it went back to
        settled = getattr(exc, "outcome", None) or {}
        back = (settled.get("action") or settled.get("outcome")) == "rolled-back"
        return ApplyReport(host.name, status, message=str(exc), exit_code=exc.exit_code,
                           rolled_back_to=settled.get("to") if back else None,
                           timings={"total": time.monotonic() - t}, details={"settled": settled} if settled else {})


def rollout(hosts: list[Host], action: Callable[[Host], ApplyReport], *, max_parallel: int = 4, max_fail: int = 0,
            canary: bool = True, progress: Callable[[str], None] = lambda m: None) -> FleetResult:
    """Run ``action`` on every host: canary first (unless ``canary`` is False), then the others in parallel."""
    if not hosts:
        raise InputError("no hosts selected")
    if max_parallel < 1:
        raise InputError(f"--max-parallel must be at least 1, got {max_parallel}")
    if max_fail < 0:
        raise InputError(f"--max-fail must be 0 or more, got {max_fail}")
    t0 = time.monotonic()
    reports: list[ApplyReport] = []
    rest = list(hosts)
    if canary and len(hosts) > 1:
        first = rest.pop(0)
        progress(f"canary: {first.name}")
        report = _guarded(action, first, progress)
        reports.append(report)
        if not report.ok:
            names = [h.name for h in rest]
            return FleetResult(reports, names, f"canary {first.name} failed ({report.status}); the other hosts were not touched",
                               time.monotonic() - t0)
    try:
        return _rest(hosts, rest, reports, action, max_parallel, max_fail, progress, t0)
    except KeyboardInterrupt:
        from .lease import abandon_all

        handed = abandon_all("interrupted (Ctrl-C during a fleet apply)")
        progress(f"interrupted: {handed} host(s) in the middle of a run were handed to their hosts, which roll back "
                 "anything not yet probed")
        raise


def _rest(hosts: list[Host], rest: list[Host], reports: list[ApplyReport], action: Callable[[Host], ApplyReport],
          max_parallel: int, max_fail: int, progress: Callable[[str], None], t0: float) -> FleetResult:
    lock = threading.Lock()
    failures = sum(1 for r in reports if not r.ok)
    skipped: list[str] = []
    aborted = ""
    pending: set[Future] = set()
    with ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="ddtree-fleet") as pool:
        queue = list(rest)
        while queue or pending:
            while queue and len(pending) < max_parallel:
                with lock:
                    if failures > max_fail:
                        aborted = aborted or f"{failures} hosts failed (more than --max-fail {max_fail}); no new host started"
                        skipped.extend(h.name for h in queue)
                        queue.clear()
                        break
                host = queue.pop(0)
                progress(f"starting {host.name}")
                pending.add(pool.submit(_guarded, action, host, progress))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                report = fut.result()
                reports.append(report)
                progress(f"{report.host}: {report.status}")
                if not report.ok:
                    with lock:
                        failures += 1
    order = {h.name: i for i, h in enumerate(hosts)}
    reports.sort(key=lambda r: order.get(r.host, 0))
    return FleetResult(reports, skipped, aborted, time.monotonic() - t0)


def write_retry_file(result: FleetResult, path: Path = DEFAULT_RETRY_FILE) -> Path | None:
    """Failed and skipped hosts, one per line; the file is removed when nothing needs a retry."""
    names = result.failed + result.skipped
    if not names:
        path.unlink(missing_ok=True)
        return None
    path.write_text("".join(f"{n}\n" for n in names))
    return path


def read_retry_file(path: Path = DEFAULT_RETRY_FILE) -> list[str]:
    if not path.is_file():
        raise InputError(f"{path}: no retry file (it is written when an apply leaves failed hosts)")
    names = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    if not names:
        raise InputError(f"{path}: retry file lists no hosts")
    return names
