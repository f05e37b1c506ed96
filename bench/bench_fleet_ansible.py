"""A fleet through ``--engine ansible`` against ``--engine builtin``: wall time and SSH round trips per host (#31).

Usage: python bench/bench_fleet_ansible.py [--hosts 8] [--reps 8] [--keep]

Makes its own sandbox in a temporary directory (``--hosts`` sshd hosts on sglang 0.5.11, each with a stand-in
server in a release root of its own, as bench/bench_deploy.py does) and removes it afterwards. Each rep deploys the
same small overlay to every host twice, once per engine, in alternating order (builtin first on even reps, ansible
first on odd ones), after removing every release root, so both start from the same state:

- builtin: ``fleet.rollout`` over ``deploy.deploy_overlay`` (what ``apply`` runs for several hosts): a canary, then
  the rest with ``--max-parallel`` = the fleet size;
- ansible: ``ansible.engine.apply`` (what ``apply --engine ansible`` runs) with ``serial: [1, "100%"]`` (the same
  canary, then the rest) and forks = the fleet size, through ansible-runner and the built ``ddtree.deploy``
  collection; the bundles are made inside the timed part, as the CLI makes them.

Both measure the deploy machinery, not SGLang (the stand-in serves; no baseline is recorded). Round trips: builtin,
every SSH channel the tool's own connections open (one per command: ``SSHConnection._channel``), and connections
opened; ansible, every ``ssh`` process Ansible starts (an ``ANSIBLE_SSH_EXECUTABLE`` wrapper logs the port it
connects to), which with pipelining and ControlPersist is one per task per host over a kept master connection.
Ratios (ansible / builtin) are of the mean wall times over reps, with a 95 % bootstrap interval (20,000 resamples,
seed 0).

Results: bench/results/fleet-ansible.json and .md, with the load average (the box is shared with other work).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from ddtree_deploy.ansible import bundle as bundle_mod  # noqa: E402
from ddtree_deploy.ansible import engine as ansible_engine  # noqa: E402
from ddtree_deploy.deploy import deploy_overlay  # noqa: E402
from ddtree_deploy.fleet import rollout  # noqa: E402
from ddtree_deploy.inventory import Host, load_inventory  # noqa: E402
from ddtree_deploy.sandbox import Sandbox  # noqa: E402
from ddtree_deploy.transport import ssh as ssh_transport  # noqa: E402
from standin.helpers import install_standin, overlay, remove_root, standin_host  # noqa: E402

BASE = "0.5.11"
RESAMPLES = 20_000

#: SSH channels / connections the builtin engine opened, per host name (counted in this process).
CHANNELS: collections.Counter[str] = collections.Counter()
CONNECTS: collections.Counter[str] = collections.Counter()


def _count_builtin() -> None:
    channel, opener = ssh_transport.SSHConnection._channel, ssh_transport.SSHConnection.open

    def counted_channel(self):  # type: ignore[no-untyped-def]
        CHANNELS[self.host.name] += 1
        return channel(self)

    def counted_open(self):  # type: ignore[no-untyped-def]
        before = self.conn.client.get_transport() if getattr(self.conn, "client", None) else None
        opener(self)
        after = self.conn.client.get_transport() if getattr(self.conn, "client", None) else None
        if after is not None and after is not before:
            CONNECTS[self.host.name] += 1

    ssh_transport.SSHConnection._channel = counted_channel  # type: ignore[method-assign]
    ssh_transport.SSHConnection.open = counted_open  # type: ignore[method-assign]


def _ssh_wrapper(work: Path) -> Path:
    """An ``ssh`` that appends the port it is asked to reach to work/ssh-calls.log, then execs the real one."""
    real = shutil.which("ssh")
    if not real:
        raise SystemExit("bench_fleet_ansible: no ssh client on PATH (Ansible's ssh connection needs one)")
    log = work / "ssh-calls.log"
    wrapper = work / "ssh-counting"
    wrapper.write_text(f"""#!/bin/sh
port=
prev=
for a in "$@"; do
  case "$prev" in -p) port=$a ;; esac
  case "$a" in Port=*) port=${{a#Port=}} ;; esac
  prev=$a
done
echo "$port" >> {log}
exec {real} "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def _interval(a: list[float], b: list[float]) -> dict[str, float]:
    rng = np.random.default_rng(0)
    xa, xb = np.asarray(a), np.asarray(b)
    ma = xa[rng.integers(0, len(xa), size=(RESAMPLES, len(xa)))].mean(1)
    mb = xb[rng.integers(0, len(xb), size=(RESAMPLES, len(xb)))].mean(1)
    q = ma / mb
    return {"ratio": round(float(xa.mean() / xb.mean()), 3), "ci_low": round(float(np.percentile(q, 2.5)), 3),
            "ci_high": round(float(np.percentile(q, 97.5)), 3)}


def _reset(copies: list[Host]) -> None:
    for h in copies:
        remove_root(h)


def run_builtin(copies: list[Host]) -> dict[str, Any]:
    CHANNELS.clear()
    CONNECTS.clear()
    t = time.perf_counter()
    res = rollout(copies, lambda h: deploy_overlay(h, overlay(), record_baseline=False), max_parallel=len(copies),
                  max_fail=0)
    wall = time.perf_counter() - t
    if res.exit_code != 0:
        raise SystemExit(f"builtin engine: {[(r.host, r.status, r.message) for r in res.reports]}")
    return {"wall_s": wall, "channels": {h.name: CHANNELS[h.name] for h in copies},
            "connections": {h.name: CONNECTS[h.name] for h in copies}}


def run_ansible(copies: list[Host], work: Path) -> dict[str, Any]:
    log = work / "ssh-calls.log"
    log.write_text("")

    def prepare(host: Host, directory: Path) -> Path:
        return bundle_mod.write_bundle(directory, host, overlay(), record_baseline=False)

    t = time.perf_counter()
    res = ansible_engine.apply(copies, prepare, serial=[1, "100%"], max_fail_percentage=0, dry_run=False,
                               forks=len(copies))
    wall = time.perf_counter() - t
    if res.exit_code != 0:
        raise SystemExit(f"ansible engine: {[(r.host, r.status, r.message) for r in res.reports]}")
    ports = collections.Counter(line.strip() for line in log.read_text().splitlines())
    by_port = {str(h.port): h.name for h in copies}
    return {"wall_s": wall, "ssh_processes": {by_port.get(p, f"port {p or '?'}"): n for p, n in sorted(ports.items())}}


def _stats(xs: list[float]) -> dict[str, Any]:
    return {"mean": round(float(np.mean(xs)), 3), "median": round(float(np.median(xs)), 3),
            "min": round(min(xs), 3), "max": round(max(xs), 3), "runs": [round(x, 3) for x in xs]}


def write_results(doc: dict[str, Any]) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "fleet-ansible.json").write_text(json.dumps(doc, indent=1) + "\n")
    b, a, r = doc["builtin"], doc["ansible"], doc["ratio_ansible_over_builtin"]
    n = doc["hosts"]
    lines = [f"# {n} sandbox hosts: `apply --engine ansible` against `--engine builtin`", "",
             f"Measured {doc['measured']} by `python bench/bench_fleet_ansible.py --hosts {n} --reps {doc['reps']}`; "
             f"{doc['cpus']} CPUs shared by the controller, the {n} sandbox sshds, their host programs and stand-in "
             f"servers (and other work); load average {doc['load_before']} before, {doc['load_after']} after; "
             f"ansible-core {doc['ansible_core']}, ansible-runner {doc['ansible_runner']}.", "",
             "Each rep deploys the same small overlay (stand-in server, no baseline) to every host with each engine, "
             "in alternating order, from removed release roots; both as a canary then the rest at once. Wall time "
             "includes making the bundles (ansible) and every connection.", "",
             "| engine | mean s | median s | min s | max s | runs |", "|---|---|---|---|---|---|",
             f"| builtin | {b['mean']} | {b['median']} | {b['min']} | {b['max']} | {', '.join(map(str, b['runs']))} |",
             f"| ansible | {a['mean']} | {a['median']} | {a['min']} | {a['max']} | {', '.join(map(str, a['runs']))} |",
             "", f"ansible / builtin wall time: **{r['ratio']}** [95 % CI {r['ci_low']}, {r['ci_high']}] "
             f"({doc['reps']} reps each, ratio of means, bootstrap over reps).", "",
             "SSH round trips per host and deploy (the same every rep):", "",
             "| engine | what is counted | per host |", "|---|---|---|",
             f"| builtin | SSH channels (one per command) | {doc['builtin_channels_per_host']} |",
             f"| builtin | SSH connections | {doc['builtin_connections_per_host']} |",
             f"| ansible | ssh processes (one per task, over a ControlPersist master) | "
             f"{doc['ansible_ssh_per_host']} |", "", doc["reading"]]
    (out / "fleet-ansible.md").write_text("\n".join(lines) + "\n")


def _per_host(counts: list[dict[str, int]], names: list[str]) -> str:
    """'7' when every host of every rep had the same count, else 'min-max'."""
    vals = [c.get(n, 0) for c in counts for n in names]
    return str(vals[0]) if min(vals) == max(vals) else f"{min(vals)}-{max(vals)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    args = ap.parse_args()
    import ansible_runner  # noqa: F401 - the [ansible] extra: fail here, before the sandbox starts
    from importlib.metadata import version

    tmp = Path(tempfile.mkdtemp(prefix="ddtree-bench-fleet-ansible-"))
    os.environ["DDTREE_SNAPSHOTS"] = str(tmp / "snapshots")
    os.environ["XDG_STATE_HOME"] = str(tmp / "state-home")  # the built collection (paths.state_dir) goes there
    os.environ["ANSIBLE_SSH_EXECUTABLE"] = str(_ssh_wrapper(tmp))
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    _count_builtin()
    box = Sandbox(tmp / "state", tmp / "hosts", log=lambda m: print(m, file=sys.stderr))
    load_before = os.getloadavg()
    try:
        t = time.perf_counter()
        box.up(tuple((f"fleet-{i}", BASE) for i in range(args.hosts)))
        print(f"sandbox of {args.hosts} hosts up in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        hosts = [h for _, h in sorted(load_inventory(tmp / "hosts").items())]
        copies = [standin_host(h, "bench-fleet-ansible") for h in hosts]
        for h in copies:
            install_standin(h)
        builtin: list[dict[str, Any]] = []
        ansible: list[dict[str, Any]] = []
        for rep in range(args.reps):
            order = ("builtin", "ansible") if rep % 2 == 0 else ("ansible", "builtin")
            for engine in order:
                _reset(copies)
                r = run_builtin(copies) if engine == "builtin" else run_ansible(copies, tmp)
                (builtin if engine == "builtin" else ansible).append(r)
                print(f"rep {rep + 1}/{args.reps} {engine}: {r['wall_s']:.2f} s", file=sys.stderr)
        _reset(copies)
        names = [h.name for h in copies]
        bw, aw = [r["wall_s"] for r in builtin], [r["wall_s"] for r in ansible]
        doc: dict[str, Any] = {
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "sglang": BASE, "hosts": args.hosts,
            "reps": args.reps, "ansible_core": version("ansible-core"), "ansible_runner": version("ansible-runner"),
            "builtin": _stats(bw), "ansible": _stats(aw), "ratio_ansible_over_builtin": _interval(aw, bw),
            "builtin_channels_per_host": _per_host([r["channels"] for r in builtin], names),
            "builtin_connections_per_host": _per_host([r["connections"] for r in builtin], names),
            "ansible_ssh_per_host": _per_host([r["ssh_processes"] for r in ansible], names),
            "runs": {"builtin": builtin, "ansible": ansible},
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()]}
        doc["reading"] = (
            "Reading: the sandbox hosts are processes on this one machine, so both engines' parallel parts compete "
            "for its CPUs; Ansible's own cost is the controller's (a Python fork per host and task, module "
            "packaging, the callback events ansible-runner turns into progress lines), which real hosts do not "
            "take off it. The builtin engine holds one connection per host for the whole deploy; Ansible starts "
            "an ssh process per task over a ControlPersist master.")
        write_results(doc)
        print((HERE / "results" / "fleet-ansible.md").read_text())
    finally:
        if not args.keep:
            box.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
