"""``bench --host H`` and ``tune --host H`` through the installed console script, on a real sshd sandbox host whose
server is the reference engine (issue 20, item 5).

The host is the sandbox's base host under a name, release root and server port of its own (same sshd, same SGLang
0.5.11), so these tests change nothing the other tests use. What is checked: the three configs side by side with
the server put back exactly as configured; tune's dry run writes nothing; tune writes the schedule into the host
file with every other line and comment intact, and --apply restarts the server on it; bad input (unknown host, a bad
prompts file, bad batch sizes or budgets, the server down, a release whose runtime cannot take a schedule) is one
line with the right exit code and the host untouched; Ctrl-C during a bench leaves the server as configured.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hostcopy import base_host_doc, new_inventory

from ddtree_deploy import tune as tune_mod
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.server import base_url
from ddtree_deploy.transport import HostConnection

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
NAME = "tunebox"
HEADER = "# tune test host: this comment and the one on ddtree_flags must survive tune\n"
FLAGS = "--speculative-algorithm DFLASH --speculative-ddtree-budget 16"
WORK = ["--max-new-tokens", "12"]


@pytest.fixture(scope="module")
def box(sandbox, wheel_env, tmp_path_factory):
    root, inv = new_inventory(tmp_path_factory, "tune")
    doc = base_host_doc(sandbox, NAME, "/srv/ddtree-host/tune-releases")
    doc["server"].pop("ddtree_flags")
    # the reference engine's emulated GPU round cost (refengine README): a fixed part per step, a part per token
    doc["server"]["command"] = doc["server"]["command"].replace(
        "{ddtree_flags}", "--step-cost-ms 4 --verify-token-cost-us 60 {ddtree_flags}")
    text = HEADER + yaml.safe_dump(doc, sort_keys=False).replace(
        "  port:", f"  ddtree_flags: {FLAGS}  # the budget tune rewrites\n  port:", 1)
    host_file = inv / f"{NAME}.yaml"
    host_file.write_text(text)
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(root / "snapshots")}

    def run(*args: str, timeout: float = 600):
        return wheel_env.run(*args, timeout=timeout, **env)

    applied = run("apply", "--host", NAME, "--json")
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    yield run, host_file, env, wheel_env
    run("server", "stop", NAME, timeout=120)


def _info(host_file: Path) -> dict:
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        reply = conn.call("probe", "server_info", url=base_url(host), timeout=30)
    return reply.get("info") or {} if reply.get("status") == 200 else {}


def _one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    first = proc.stderr.strip().splitlines()[0]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in first, first
    return first


def test_bench_plain_chain_ddtree_side_by_side_and_puts_the_server_back(box) -> None:
    run, host_file, _, _ = box
    before = _info(host_file)
    assert before["speculative_ddtree_budget"] == 16
    res = run("bench", "--host", NAME, "--batch-sizes", "1,2", *WORK, "--reps", "2", "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(res.stdout)
    rows = {(r["config"], r["batch"]): r for r in doc["rows"]}
    assert set(rows) == {(c, b) for c in ("ddtree", "chain", "plain") for b in (1, 2)}
    assert doc["reps"] == 2
    for (config, batch), r in rows.items():
        assert r["requests"] >= 2 * batch and r["tokens"] == r["requests"] * 12 and r["tok_s"] > 0
        assert r["reps"] == 2 and 0 < r["tok_s_min"] <= r["tok_s"] <= r["tok_s_max"]  # median within its spread
        assert 0 < r["round_ms_min"] <= r["round_ms"] <= r["round_ms_max"]
        assert r["latency_ms"] > 0 and r["latency_p90_ms"] >= r["latency_ms"] * 0.5 and r["round_ms"] > 0
        if config == "plain":
            assert r["accept_length"] is None
        else:
            assert 1.0 <= r["accept_length"] <= 8.0  # block size 8: at most 7 drafts + the bonus token per round
    assert rows[("ddtree", 1)]["budget"] == "16" and rows[("chain", 1)]["budget"] == "0"
    assert doc["restored"]["same_config"] and doc["restored"]["restarts"] == 3  # chain, plain, back
    after = _info(host_file)
    assert after["speculative_ddtree_budget"] == 16 and after["speculative_algorithm"] == "DFLASH"
    assert after["pid"] != before["pid"]  # it was restarted, and runs as configured again
    figure = host_file.parent / "bench.svg"
    table = run("bench", "--host", NAME, "--batch-sizes", "1", *WORK, "--reps", "2", "--plot", str(figure))
    assert table.returncode == 0, table.stderr[-2000:]
    text = " ".join(table.stdout.split())
    assert "median (min–max) of 2 reps" in text and "–" in text.split("median", 1)[1]  # each cell's spread
    assert f"wrote {figure}" in text
    svg = figure.read_text()  # matplotlib's SVG, labels kept as text
    assert svg.lstrip().startswith("<?xml") and all(f">{c}<" in svg for c in ("ddtree", "chain", "plain"))
    pid = _info(host_file)["pid"]
    unwritten = host_file.parent / "dry.svg"
    dry = run("bench", "--host", NAME, "--batch-sizes", "1", "--dry-run", "--plot", str(unwritten))
    assert dry.returncode == 0 and "dry run: nothing was touched" in dry.stdout and "3 times" in dry.stdout
    assert f"draw the result into {unwritten}" in " ".join(dry.stdout.split()) and not unwritten.exists()
    assert _info(host_file)["pid"] == pid


def test_bench_table_keeps_every_number_whole_at_80_columns(box) -> None:
    _, _, env, wheel_env = box
    res = wheel_env.run("bench", "--host", NAME, "--batch-sizes", "1", *WORK, timeout=600, COLUMNS="80", **env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in res.stdout
    # ten columns do not fit 80: each config is a block of "name  value" lines, every number whole on its line
    # (the old table split them mid-number, `1569.` over `41`)
    # (the old table split them mid-number, `1569.` over `41`); tok/s is the median with its min–max over the reps
    number = r"\d+(\.\d+)?"
    for name in ("tok/s", "latency ms", "p90 ms", "ms/token", "round ms"):
        values = [line[len(name):].strip() for line in lines if line.startswith(name + " ")]
        cell = rf"{number}( \({number}–{number}\))?" if name == "tok/s" else number
        assert len(values) == 3 and all(re.fullmatch(cell, v) for v in values), (name, res.stdout)
    assert sorted(line.split()[-1] for line in lines if line.startswith("config ")) == ["chain", "ddtree", "plain"]


def _server(host_file: Path) -> tuple[int, str]:
    """The managed server's pid and start time (from its pid file, through the tool's own status call)."""
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        status = conn.call("server", "status", root=host.release_root)
    return status["pid"], status["started"]


def test_tune_dry_run_restarts_nothing_and_says_what_it_would_measure(box) -> None:
    """Issue 25.4: `tune --dry-run` restarted the server four times (it measured, then did not write)."""
    run, host_file, _, _ = box
    text, before = host_file.read_text(), _server(host_file)
    res = run("tune", "--host", NAME, "--batch-sizes", "1", "--budgets", "8,16", *WORK, "--reps", "4", "--dry-run")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = " ".join(res.stdout.split())
    assert "measure the server as it runs for ddtree-16" in out  # the running budget: no restart for it
    assert "restart the server for ddtree-8" in out and "restart the server for chain" in out
    assert out.count("run the workload 4 times at batch 1") == 4 and "(4 restarts in all)" in out
    assert "nothing was touched (no restart, nothing written)" in out
    doc = json.loads(run("tune", "--host", NAME, *WORK, "--dry-run", "--json").stdout)
    assert doc["dry_run"] is True and doc["written"] is False and doc["reps"] == 3 and doc["running_budget"] == "16"
    assert doc["batch_sizes"]  # the sizes in use, read from the running server
    assert _server(host_file) == before and host_file.read_text() == text  # same pid, same start: never restarted


def _invariant(doc: dict, current: str) -> None:
    """A schedule is written only where the fitted budget's worst rep beats the current one's best; a fitted
    schedule that wins only within the spread is reported and the current one kept."""
    cells = {(m["config"], m["batch"]): m for m in doc["measurements"]}
    sched = tune_mod.schedule_module()
    now = sched.parse_schedule(current)

    def cell(budget: int, bs: int) -> dict:
        return cells[("chain" if budget == 0 else f"ddtree-{budget}", bs)]

    fitted = sched.parse_schedule(doc.get("fitted_schedule") or doc["schedule"])
    differing = [bs for bs in doc["batch_sizes"] if fitted.budget_for(bs) != now.budget_for(bs)]
    if doc["written"]:  # a real gain: the fitted budget's worst rep beats the current one's best
        assert differing and all(cell(fitted.budget_for(bs), bs)["tok_s_min"] > cell(now.budget_for(bs), bs)["tok_s_max"]
                                 for bs in differing), doc
    elif doc["within_noise"]:  # kept, and said so with the cells
        assert doc["schedule"] == str(now) and differing and [c["batch"] for c in doc["within_noise"]] == differing
        assert all(cell(fitted.budget_for(bs), bs)["tok_s_min"] <= cell(now.budget_for(bs), bs)["tok_s_max"]
                   for bs in differing)
    else:
        assert doc["unchanged"] and not differing


def test_tune_reports_reps_and_spread_and_keeps_the_schedule_within_noise(box) -> None:
    """Issue 25.4: two runs 40 s apart chose different schedules with no repeats or spread shown. Budgets 15 and
    16 cost the same to within one token per round: any difference between them is noise."""
    run, host_file, _, _ = box
    text = host_file.read_text()
    try:
        for _ in range(2):
            res = run("tune", "--host", NAME, "--batch-sizes", "1", "--budgets", "15,16", *WORK, "--reps", "3", "--json")
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            doc = json.loads(res.stdout)
            assert doc["reps"] == 3
            for m in doc["measurements"]:
                assert m["reps"] == 3 and 0 < m["tok_s_min"] <= m["tok_s"] <= m["tok_s_max"]
            assert {(m["config"], m["batch"]) for m in doc["measurements"]} == {
                (c, 1) for c in ("ddtree-15", "ddtree-16", "chain", "plain")}
            prof = doc["accept_profile"]
            assert len(prof) == 7 and all(len(p) == 8 and sum(p) <= 1.0 + 1e-6 for p in prof)
            assert prof[0][0] > 0  # the drafter's first rank is often the target's token
            assert doc["restored"]["same_config"]
            _invariant(doc, doc["old_flags"].rsplit(" ", 1)[1])
            if not doc["written"]:
                assert load_host_file(host_file).server["ddtree_flags"] == doc["old_flags"]  # nothing written
            host_file.write_text(text)  # the second run on the same, unchanged host (a real gain was written)
        table = run("tune", "--host", NAME, "--batch-sizes", "1", "--budgets", "15,16", *WORK, "--reps", "2")
        assert table.returncode == 0, table.stderr[-2000:]
        out = " ".join(table.stdout.split())
        assert "median (min–max) of 2 reps" in out
        assert ("only within noise" in out and "keeping the current one" in out) or "already runs this schedule" in out \
            or "wrote " in out
    finally:
        host_file.write_text(text)


def test_tune_writes_the_schedule_keeping_the_file_and_apply_restarts_on_it(box) -> None:
    run, host_file, _, _ = box
    text = host_file.read_text()
    figure = host_file.parent / "tune.svg"
    res = run("tune", "--host", NAME, "--batch-sizes", "1,2", "--budgets", "4,16", *WORK, "--margin", "0", "--reps",
              "2", "--apply", "--plot", str(figure))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "tok/s by budget x batch" in res.stdout and "schedule:" in res.stdout
    svg = figure.read_text()  # tok/s per budget with the fitted schedule, and the measured acceptance by depth
    assert all(f">{label}<" in svg for label in ("b4", "b16", "chain", "plain", "draft depth")) and ">schedule " in svg
    schedule = res.stdout.split("schedule: ", 1)[1].split()[0]
    new = host_file.read_text()
    if new == text:  # the fit kept budget 16 for every size, or won only within noise: nothing to write
        assert "already runs this schedule" in res.stdout or "only within noise" in " ".join(res.stdout.split())
        return
    old_lines, new_lines = text.splitlines(), new.splitlines()
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].endswith(f"--speculative-ddtree-budget {schedule}  # the budget tune rewrites")
    assert new.startswith(HEADER)
    host = load_host_file(host_file)
    assert host.server["ddtree_flags"] == f"--speculative-algorithm DFLASH --speculative-ddtree-budget {schedule}"
    info = _info(host_file)
    assert str(info["speculative_ddtree_budget"]) == schedule  # --apply: the server runs it now
    host_file.write_text(text)  # the next tests expect the host file's budget 16 again
    back = run("server", "restart", NAME)
    assert back.returncode == 0, back.stderr


def test_bad_input_is_one_line_and_leaves_the_host_alone(box, tmp_path) -> None:
    run, host_file, _, _ = box
    pid = _info(host_file)["pid"]
    _one_line_error(run("bench", "--host", "nosuch"), 2, "nosuch")
    empty = tmp_path / "prompts.txt"
    empty.write_text("\n\n")
    _one_line_error(run("bench", "--host", NAME, "--prompts", str(empty)), 2, str(empty), "no prompts")
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('"fine"\n{"text": 3}\n')
    _one_line_error(run("tune", "--host", NAME, "--prompts", str(bad)), 2, f"{bad}:2")
    _one_line_error(run("bench", "--host", NAME, "--prompts", str(tmp_path / "missing.txt")), 2, "missing.txt")
    _one_line_error(run("bench", "--host", NAME, "--batch-sizes", "0"), 2, "--batch-sizes")
    _one_line_error(run("tune", "--host", NAME, "--budgets", "16,5000"), 2, "--budgets")
    _one_line_error(run("tune", "--host", NAME, "--batch-sizes", "1,64", *WORK), 2, "max_running_requests")
    _one_line_error(run("bench", "--host", NAME, *WORK, "--plot", str(tmp_path / "fig.jpg")), 2, "fig.jpg", "suffix")
    _one_line_error(run("tune", "--host", NAME, *WORK, "--plot", str(tmp_path / "no" / "fig.svg")), 2, "does not exist")
    assert _info(host_file)["pid"] == pid  # refused before any restart


def test_server_down_is_said_and_stays_down(box) -> None:
    run, host_file, _, _ = box
    assert run("server", "stop", NAME).returncode == 0
    try:
        for cmd in ("bench", "tune"):
            _one_line_error(run(cmd, "--host", NAME, *WORK), 1, "server is not up")
        assert _info(host_file) == {}  # still down: nothing was started behind the user's back
    finally:
        assert run("server", "start", NAME).returncode == 0


def _as_from_a_shell() -> None:
    """A shell starts a command with Ctrl-C deliverable: SIGINT unblocked and at its default (the test worker's
    thread may block or ignore it, and a child inherits both across exec)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigint_ignored_or_blocked(pid: int) -> bool:
    bit = 1 << (signal.SIGINT - 1)
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    return any(int(status.get(key, "0"), 16) & bit for key in ("SigIgn", "SigBlk"))


def test_ctrl_c_during_bench_leaves_the_server_as_configured(box) -> None:
    _, host_file, env, wheel_env = box
    """Interrupted while the server restarts for plain decoding: the host's guardian puts it back as configured."""
    proc = subprocess.Popen([str(wheel_env.script), "bench", "--host", NAME, *WORK], env=wheel_env.env(**env),
                            cwd=wheel_env.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_shell)
    seen = ""
    deadline = time.monotonic() + 300
    while "restarting the server for plain" not in seen and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert "restarting the server for plain" in seen, seen
    assert not _sigint_ignored_or_blocked(proc.pid), "the command cannot see Ctrl-C"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, seen + err
    assert "Traceback" not in err
    info = _info(host_file)
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_ddtree_budget"] == 16
    # the interrupted run said how the host was settled; the next command does not say it again
    again = wheel_env.run("server", "restart", NAME, timeout=300, **env)  # a write command: it takes the lock
    assert again.returncode == 0 and "stopped early" not in again.stderr, again.stderr


def test_a_release_whose_runtime_takes_no_schedule_is_refused_untouched(box) -> None:
    """Last: it removes schedule.py from the active release on the host (as an older patch set would have it)."""
    run, host_file, _, _ = box
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        conn.run(f"rm -f {host.release_root}/current/sglang/srt/speculative/ddtree/schedule.py")
    pid = _info(host_file)["pid"]
    text = host_file.read_text()
    _one_line_error(run("tune", "--host", NAME, *WORK), 2, "cannot take a budget schedule")
    assert host_file.read_text() == text and _info(host_file)["pid"] == pid
