"""``apply`` / ``probe`` / ``rollback --engine ansible``: the overlay is built here as for the builtin engine, and the
hosts are then driven through the ``ddtree.deploy`` collection by ansible-runner's Python API: its events give the
per-host progress lines, the modules' results the host reports (the same ``ApplyReport`` the builtin engine makes),
so the recap and the retry file are the same.

Batches are Ansible's: ``serial`` (a number, a percentage or a list of them: ``1,50%`` is a canary, then halves) and
``max_fail_percentage`` (the play stops once more than that share of a batch failed; hosts not reached are
skipped). ``--dry-run`` is Ansible's ``--check --diff``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from .. import paths
from ..ddtree_stats import ddtree_summary
from ..errors import DeployError, EXIT_FAILED, InputError, OperationFailed, TransportError
from ..fleet import FleetResult
from ..inventory import Host
from ..probe import ProbeResult, Stage
from ..transaction import ApplyReport
from . import bundle as bundle_mod
from . import collection
from .hostvars import inventory_doc

Progress = Callable[[str], None]
#: The modules whose results are host reports.
_REPORTING = ("ddtree.deploy.ddtree_release", "ddtree.deploy.ddtree_rollback", "ddtree_release", "ddtree_rollback")


def _runner() -> Any:
    try:
        import ansible_runner
    except ImportError as exc:
        raise InputError(f"--engine ansible needs ansible-core and ansible-runner ({exc})",
                         hint="pip install 'ddtree-deploy[ansible]'") from None
    return ansible_runner


def parse_serial(text: str) -> list[int | str]:
    """``1,50%`` → [1, "50%"]: each item a count of hosts or a percentage, as Ansible's ``serial`` takes them."""
    out: list[int | str] = []
    for item in (p.strip() for p in text.split(",")):
        if item.endswith("%") and item[:-1].isdigit() and 0 < int(item[:-1]) <= 100:
            out.append(item)
        elif item.isdigit() and int(item) > 0:
            out.append(int(item))
        else:
            raise InputError(f"--serial: {item!r} is neither a host count (1, 2, ...) nor a percentage (1%..100%)",
                             hint="e.g. --serial 1,50% (a canary, then half the hosts at a time)")
    return out


def probe_result(d: dict[str, Any] | None) -> ProbeResult | None:
    if not d:
        return None
    stages = [Stage(s["name"], s["status"], float(s.get("seconds") or 0.0), s.get("detail") or "", s.get("data") or {},
                    s.get("log_tail") or "") for s in d.get("stages", [])]
    info = d.get("server_info") or {}
    ddtree = ddtree_summary(info.get("before"), info.get("after"), info.get("replies")) if info.get("before") else {}
    return ProbeResult(d.get("host") or "", d.get("release"), stages, d.get("label") or "probe", ddtree)


def report_from(d: dict[str, Any], host: str) -> ApplyReport:
    """A module's host report as the CLI's ApplyReport."""
    return ApplyReport(d.get("host") or host, d.get("status") or "failed", d.get("message") or "",
                       int(d.get("exit_code") or 0), d.get("release"), d.get("previous"), d.get("rolled_back_to"),
                       d.get("push"), probe_result(d.get("probe")), probe_result(d.get("rollback_probe")),
                       {k: float(v) for k, v in (d.get("timings") or {}).items()}, d.get("details") or {})


class _Events:
    """ansible-runner's event handler: progress lines and one report per host from the modules' results."""

    def __init__(self, progress: Progress, modules: tuple[str, ...]) -> None:
        self.progress, self.modules = progress, modules
        self.reports: dict[str, ApplyReport] = {}
        self.stats: dict[str, Any] = {}
        self.events = 0

    def __call__(self, event: dict[str, Any]) -> bool:
        self.events += 1
        kind, data = event.get("event"), event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_stats":
            self.stats = {k: data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped", "processed")}
        if data.get("task_action") not in self.modules or not host:
            return True
        if kind == "runner_on_start":
            self.progress(f"{host}: {data.get('task')}")
        elif kind in ("runner_on_ok", "runner_on_failed"):
            res = data.get("res") or {}
            rep = res.get("report")
            if isinstance(rep, dict):
                report = report_from(rep, host)
            else:
                report = ApplyReport(host, "failed", str(res.get("msg") or "the module failed without a report"),
                                     EXIT_FAILED)
            self.reports[host] = report
            changed = " (changed)" if res.get("changed") else ""
            self.progress(f"{host}: {report.status}{changed}")
        elif kind == "runner_on_unreachable":
            res = data.get("res") or {}
            self.reports[host] = ApplyReport(host, "unreachable", f"host {host}: {res.get('msg') or 'unreachable'}", 3)
            self.progress(f"{host}: unreachable")
        return True


def _environment(work: Path) -> dict[str, str]:
    coll = collection.ensure(paths.state_dir() / "ansible")
    return {"ANSIBLE_COLLECTIONS_PATH": str(coll), "ANSIBLE_PIPELINING": "True", "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False"}


def _run(work: Path, hosts: list[Host], events: _Events, *, forks: int, **kwargs: Any) -> Any:
    runner = _runner()
    inv = work / "inventory.yml"
    inv.write_text(yaml.safe_dump(inventory_doc(hosts)))
    envvars = _environment(work)
    for d in ("runner", "tmp", "cp"):
        (work / d).mkdir(exist_ok=True)
    # ansible-playbook from the environment this package runs in (a venv's bin is not always on PATH)
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", envvars["ANSIBLE_COLLECTIONS_PATH"])
    return runner.run(private_data_dir=str(work / "runner"), inventory=str(inv), envvars=envvars, quiet=True,
                      event_handler=events, forks=forks, json_mode=False, **kwargs)


def apply(hosts: list[Host], prepare: Callable[[Host, Path], Path], *, serial: list[int | str],
          max_fail_percentage: int, dry_run: bool, forks: int, force: bool = False, break_lock: bool = False,
          progress: Progress = lambda m: None) -> FleetResult:
    """Bundles made here (``prepare(host, dir)``: the overlay built as ``apply`` builds it), then the collection's
    ``apply`` playbook over the hosts whose bundle could be made."""
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ddtree-ansible-"))
    try:
        reports: list[ApplyReport] = []
        ready: list[Host] = []
        for host in hosts:
            try:
                prepare(host, work / "bundles")
                ready.append(host)
            except DeployError as exc:
                status = "unreachable" if exc.exit_code == 3 else "refused"
                reports.append(ApplyReport(host.name, status, message=str(exc), exit_code=exc.exit_code))
                progress(f"{host.name}: {status} ({exc.message.splitlines()[0]})")
        skipped: list[str] = []
        aborted = ""
        if ready:
            events = _Events(progress, _REPORTING)
            playbook = Path(_environment(work)["ANSIBLE_COLLECTIONS_PATH"]) / "ansible_collections" / "ddtree" / \
                "deploy" / "playbooks" / "apply.yml"
            extravars = {"ddtree_bundle_dir": str(work / "bundles"), "ddtree_serial": serial,
                         "ddtree_max_fail_percentage": max_fail_percentage, "ddtree_force": force,
                         "ddtree_break_lock": break_lock}
            r = _run(work, ready, events, forks=forks, playbook=str(playbook), extravars=extravars,
                     cmdline="--check --diff" if dry_run else None)
            reports += [events.reports[h.name] for h in ready if h.name in events.reports]
            skipped = [h.name for h in ready if h.name not in events.reports]
            if skipped:
                aborted = (f"the play stopped after a batch in which more than {max_fail_percentage}% of the hosts "
                           f"failed (serial {serial}); {len(skipped)} host(s) not started")
            if r.rc not in (0, 2, 4) and not events.reports:
                raise OperationFailed(f"ansible-runner ended with status {r.status} (rc {r.rc}) before any host ran: "
                                  + (r.stdout.read()[-2000:] if hasattr(r.stdout, "read") else ""))
        order = {h.name: i for i, h in enumerate(hosts)}
        reports.sort(key=lambda rep: order.get(rep.host, 0))
        return FleetResult(reports, skipped, aborted, time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def one_host(host: Host, module: str, module_args: dict[str, Any], *, dry_run: bool = False,
             progress: Progress = lambda m: None) -> dict[str, Any]:
    """One module of the collection on one host (ad hoc), from a plan made here; its result."""
    work = Path(tempfile.mkdtemp(prefix="ddtree-ansible-"))
    try:
        bundle_mod.write_bundle(work / "bundles", host, None)
        events = _Events(progress, (f"ddtree.deploy.{module}", module))
        results: dict[str, Any] = {}

        def keep(event: dict[str, Any]) -> bool:
            data = event.get("event_data") or {}
            if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable") and \
                    data.get("host") == host.name:
                results["res"], results["event"] = data.get("res") or {}, event["event"]
            return events(event)
        args = {"bundle": str(work / "bundles" / host.name), **module_args}
        play = [{"name": f"ddtree-deploy {module}", "hosts": host.name, "gather_facts": False,
                 "tasks": [{"name": module, f"ddtree.deploy.{module}": args}]}]
        (work / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
        _run(work, [host], keep, forks=1, playbook=str(work / "play.yml"), cmdline="--check" if dry_run else None)
        if "res" not in results:
            raise OperationFailed(f"host {host.name}: ansible ran no {module} task")
        if results["event"] == "runner_on_unreachable":
            raise TransportError(f"host {host.name}: unreachable: {results['res'].get('msg')}")
        return results["res"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
