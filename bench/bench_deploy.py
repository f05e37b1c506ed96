"""Deploy speed on sandbox hosts: push + switch, exit-to-failure detection, and a fleet of 8 against one host.

Usage: python bench/bench_deploy.py [--rounds 5] [--fleet 8] [--keep]

Makes its own sandbox in a temporary directory (``--fleet`` hosts on the patch set's base release, sglang 0.5.11)
and removes it afterwards. Measures:

- push + switch: the real DDTree overlay (the patch set applied to the host's own snapshot) pushed as a release
  (one tar stream + one build call: hard-link copy of the installed package, replaced files, byte-compiling by the
  host's Python) and switched (one call). Goal: under 2 s.
- exit → probe failure: a stand-in server (tests/standin) started in "exit" mode dies ``--crash-after`` seconds
  after start while the start-up stage is already polling; the stand-in writes its exit time (epoch) to its log,
  and we take the time at which ``Prober.startup`` returned the failure on this machine (same clock). Goal: under 1 s.
- fleet: ``deploy_overlay`` (lock, push, switch, overlay check, restart, start-up, generation, mark) of a small
  overlay with the stand-in server to one host, then to ``--fleet`` hosts through ``fleet.rollout`` (canary, then the
  rest with --max-parallel = fleet size). Goal: the fleet under 2x one host. The stand-in is used so the number
  measures the deploy machinery, not 8 torch imports on a 2-core box.

Results: bench/results/deploy-sandbox.json and .md, with the load average (the box is shared with other work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from ddtree_deploy.deploy import deploy_overlay, plan  # noqa: E402
from ddtree_deploy.fleet import rollout  # noqa: E402
from ddtree_deploy.inventory import Host, load_inventory  # noqa: E402
from ddtree_deploy.probe import Prober  # noqa: E402
from ddtree_deploy.release import ReleaseManager  # noqa: E402
from ddtree_deploy.sandbox import Sandbox  # noqa: E402
from ddtree_deploy.server import ServerControl  # noqa: E402
from ddtree_deploy.transport import HostConnection  # noqa: E402
from standin.helpers import install_standin, overlay, remove_root, standin_host  # noqa: E402

BASE = "0.5.11"


def stats(xs: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "runs": [round(x, 3) for x in xs]}


def bench_push_switch(host: Host, rounds: int) -> dict[str, Any]:
    os.chdir(REPO)
    p = plan(host)
    ov = p.overlay
    h = dataclasses.replace(host, release_root="/srv/ddtree-host/bench-push", keep_releases=2)
    push, switch, total, merged, link_modes = [], [], [], [], set()
    try:
        with HostConnection(h) as conn:
            mgr = ReleaseManager(conn)
            for i in range(rounds):  # interleaved: both ways meet the same machine load
                t = time.perf_counter()
                res = mgr.push(ov, release_id=f"bench-{i}")
                t1 = time.perf_counter()
                mgr.switch(res.release_id)
                t2 = time.perf_counter()
                push.append(t1 - t)
                switch.append(t2 - t1)
                total.append(t2 - t)
                link_modes.add(res.link_mode)
                mgr.finish(res.release_id, "good", "bench")
                t = time.perf_counter()
                res = mgr.push(ov, release_id=f"bench-{i}-merged", switch=True)
                merged.append(time.perf_counter() - t)
                assert res.switched and res.switched["to"] == res.release_id
                mgr.finish(res.release_id, "good", "bench")
    finally:
        remove_root(h)
    return {"overlay_files": len(ov.files), "overlay_bytes": sum(len(f.content) for f in ov.files),
            "patchset": f"{ov.patchset} {ov.patchset_version}", "link_mode": sorted(link_modes),
            "push": stats(push), "switch": stats(switch), "push_then_switch": stats(total), "push_switch": stats(merged)}


def bench_round_trip(host: Host, rounds: int) -> dict[str, Any]:
    """What one SSH command costs on this box (context for every other number: a deploy is ~8 of them)."""
    xs = []
    with HostConnection(host) as conn:
        for _ in range(rounds):
            t = time.perf_counter()
            conn.run("true")
            xs.append(time.perf_counter() - t)
        shell_rc = conn.run("echo ${PYENV_ROOT:-}", check=False).text().strip()
    return {"run_true": stats(xs), "login_shell_sources_pyenv": bool(shell_rc)}


def bench_exit_detection(host: Host, rounds: int, crash_after: float) -> dict[str, Any]:
    h = standin_host(host, "bench-exit", probe={"startup_timeout": crash_after + 10})
    h = dataclasses.replace(h, server=dict(h.server, env={"STANDIN_MODE": "exit"},
                                           command=h.server["command"] + f" --crash-after {crash_after}"))
    install_standin(h)
    latencies, polls = [], []
    try:
        with HostConnection(h) as conn:
            ctl = ServerControl(conn)
            prober = Prober(conn)
            for _ in range(rounds):
                ctl.restart(release=None, ddtree=False)
                stage = prober.startup(None)
                failed_at = time.time()
                assert stage.status == "fail" and "is not running" in stage.detail, stage
                m = re.search(r"standin: exit at ([0-9.]+)", ctl.logs(50)["text"])
                assert m, "stand-in did not log its exit"
                latencies.append(failed_at - float(m.group(1)))
                polls.append(stage.data.get("seconds"))
    finally:
        remove_root(h)
    return {"crash_after_s": crash_after, "exit_to_failure": stats(latencies),
            "on_host_wait_ready_s": stats([p for p in polls if p is not None])}


def _deploy_one(h: Host):
    return deploy_overlay(h, overlay(), record_baseline=False)


def busy_cpu_seconds() -> float:
    """CPU seconds spent by everything on this machine so far (/proc/stat), to show how shared the box was."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def bench_idle_load(seconds: float = 3.0) -> float:
    """Busy cores while this benchmark does nothing: other work on the shared box."""
    b, t = busy_cpu_seconds(), time.perf_counter()
    time.sleep(seconds)
    return round((busy_cpu_seconds() - b) / (time.perf_counter() - t), 2)


def bench_fleet(hosts: list[Host], rounds: int) -> dict[str, Any]:
    copies = [standin_host(h, "bench-fleet") for h in hosts]
    for h in copies:
        install_standin(h)
    single, fleet, no_canary, per_host, busy = [], [], [], [], []
    try:
        for _ in range(rounds):
            for h in copies:
                remove_root(h)
            t = time.perf_counter()
            r = _deploy_one(copies[0])
            single.append(time.perf_counter() - t)
            assert r.status == "ok", r.message
            for h in copies:
                remove_root(h)
            t = time.perf_counter()
            res = rollout(copies, _deploy_one, max_parallel=len(copies), max_fail=0)
            fleet.append(time.perf_counter() - t)
            assert res.exit_code == 0, [x.message for x in res.reports]
            per_host.append([round(sum(x.timings.values()), 3) for x in res.reports])
            for h in copies:
                remove_root(h)
            t, b = time.perf_counter(), busy_cpu_seconds()
            res = rollout(copies, _deploy_one, max_parallel=len(copies), max_fail=0, canary=False)
            no_canary.append(time.perf_counter() - t)
            busy.append((busy_cpu_seconds() - b) / no_canary[-1])
            assert res.exit_code == 0, [x.message for x in res.reports]
    finally:
        for h in copies:
            remove_root(h)
    ratio = [f / s for f, s in zip(fleet, single, strict=True)]
    ratio_nc = [f / s for f, s in zip(no_canary, single, strict=True)]
    return {"hosts": len(copies), "one_host": stats(single), "fleet": stats(fleet), "ratio": stats(ratio),
            "fleet_no_canary": stats(no_canary), "ratio_no_canary": stats(ratio_nc), "fleet_host_seconds": per_host,
            "busy_cores_during_parallel_fleet": stats(busy)}


def write_results(doc: dict[str, Any]) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "deploy-sandbox.json").write_text(json.dumps(doc, indent=1) + "\n")
    ps, ex, fl, rt = doc["push_switch"], doc["exit_detection"], doc["fleet"], doc["round_trip"]
    row = lambda name, s, goal="": f"| {name} | {s['median']} | {s['min']} | {s['max']} | {', '.join(map(str, s['runs']))} | {goal} |"  # noqa: E731
    lines = [
        "# deploy on sandbox hosts",
        "",
        f"Measured {doc['measured']} by `python bench/bench_deploy.py`; {doc['cpus']} CPUs shared with the sandbox hosts "
        f"(and other work); load average {doc['load_before']} before, {doc['load_after']} after.",
        "",
        "| what | median s | min s | max s | runs | goal |",
        "|---|---|---|---|---|---|",
        row("one SSH command (`true`) on a sandbox host", rt["run_true"]),
        row(f"push + switch as apply does it: one round trip (DDTree overlay, {ps['overlay_files']} files, "
            f"{ps['overlay_bytes'] // 1024} KiB, {ps['patchset']})", ps["push_switch"], "< 2 s"),
        row("push, then switch (two round trips)", ps["push_then_switch"]),
        row("  push alone (tar stream + build in one round trip)", ps["push"]),
        row("  switch alone (one call)", ps["switch"]),
        row(f"server exit → probe failure (stand-in exits {ex['crash_after_s']} s after start)", ex["exit_to_failure"], "< 1 s"),
        row("  on-host wait_ready until it saw the death (from call start)", ex["on_host_wait_ready_s"]),
        row("apply to one host (stand-in server)", fl["one_host"]),
        row(f"apply to {fl['hosts']} hosts (canary, then {fl['hosts'] - 1} in parallel)", fl["fleet"]),
        row(f"ratio {fl['hosts']} hosts / one host", fl["ratio"], "< 2x"),
        row(f"apply to {fl['hosts']} hosts, all in parallel (no canary)", fl["fleet_no_canary"]),
        row("  ratio without canary / one host", fl["ratio_no_canary"]),
        "",
        f"- push + switch under 2 s (median): **{'yes' if ps['push_switch']['median'] < 2 else 'no'}**; link mode: {', '.join(ps['link_mode'])}",
        f"- exit → failure under 1 s (every run): **{'yes' if ex['exit_to_failure']['max'] < 1 else 'no'}**",
        f"- fleet of {fl['hosts']} under 2x one host (median): **{'yes' if fl['ratio']['median'] < 2 else 'no'}**",
        "",
        "Reading the fleet rows: with a canary, the other hosts start only after one full deploy, so `canary + rest`",
        "is at least 2x one host even with perfect parallelism; the no-canary row shows how well the hosts overlap.",
        "A deploy is 7 SSH commands plus the connection (lock, push+switch, overlay check, restart,",
        "start-up+generation, finish); the 8 sandbox hosts are processes on this one 2-CPU machine, so their sshds,",
        "remote Pythons and servers compete for the same 2 CPUs, together with other work on the box: "
        f"{doc['idle_busy_cores']} cores were busy while this benchmark slept, and "
        f"{fl['busy_cores_during_parallel_fleet']['median']} during the parallel fleet (of 2).",
        "The parallel part is CPU-bound here; against real hosts, where each host has its own CPUs, it is bound by",
        "network round trips and overlaps."
        + (" (Every SSH command here also sourced root's .bashrc, which runs `pyenv init`.)" if rt["login_shell_sources_pyenv"] else ""),
    ]
    (out / "deploy-sandbox.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fleet", type=int, default=8)
    ap.add_argument("--fleet-rounds", type=int, default=2)
    ap.add_argument("--crash-after", type=float, default=1.5)
    ap.add_argument("--keep", action="store_true", help="leave the bench sandbox running")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-bench-deploy-"))
    os.environ["DDTREE_SNAPSHOTS"] = str(tmp / "snapshots")
    box = Sandbox(tmp / "state", tmp / "hosts", log=lambda m: print(m, file=sys.stderr))
    specs = tuple((f"bench-{i}", BASE) for i in range(args.fleet))
    load_before = os.getloadavg()
    try:
        t = time.perf_counter()
        box.up(specs)
        print(f"sandbox of {args.fleet} hosts up in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        hosts = [h for _, h in sorted(load_inventory(tmp / "hosts").items())]
        doc: dict[str, Any] = {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                               "machine": platform.machine(), "python": platform.python_version(), "sglang": BASE}
        doc["idle_busy_cores"] = bench_idle_load()
        doc["round_trip"] = bench_round_trip(hosts[0], args.rounds * 2)
        print("push + switch ...", file=sys.stderr)
        doc["push_switch"] = bench_push_switch(hosts[0], args.rounds)
        print("exit detection ...", file=sys.stderr)
        doc["exit_detection"] = bench_exit_detection(hosts[0], args.rounds, args.crash_after)
        print("fleet ...", file=sys.stderr)
        doc["fleet"] = bench_fleet(hosts, args.fleet_rounds)
        doc["load_before"] = [round(x, 2) for x in load_before]
        doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
        write_results(doc)
        print((HERE / "results" / "deploy-sandbox.md").read_text())
    finally:
        if not args.keep:
            box.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
