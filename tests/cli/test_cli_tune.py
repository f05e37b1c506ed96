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
    res = run("bench", "--host", NAME, "--batch-sizes", "1,2", *WORK, "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(res.stdout)
    rows = {(r["config"], r["batch"]): r for r in doc["rows"]}
    assert set(rows) == {(c, b) for c in ("ddtree", "chain", "plain") for b in (1, 2)}
    for (config, batch), r in rows.items():
        assert r["requests"] >= batch and r["tokens"] == r["requests"] * 12 and r["tok_s"] > 0
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
    table = run("bench", "--host", NAME, "--batch-sizes", "1", "--dry-run")
    assert table.returncode == 0 and "dry run: nothing was touched" in table.stdout
    assert _info(host_file)["pid"] == after["pid"]


def test_bench_table_keeps_every_number_whole_at_80_columns(box) -> None:
    _, _, env, wheel_env = box
    res = wheel_env.run("bench", "--host", NAME, "--batch-sizes", "1", *WORK, timeout=600, COLUMNS="80", **env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in res.stdout
    # ten columns do not fit 80: each config is a block of "name  value" lines, every number whole on its line
    # (the old table split them mid-number, `1569.` over `41`)
    for name in ("tok/s", "latency ms", "p90 ms", "ms/token", "round ms"):
        values = [line.split()[-1] for line in lines if line.startswith(name + " ")]
        assert len(values) == 3 and all(re.fullmatch(r"\d+(\.\d+)?", v) for v in values), (name, res.stdout)
    assert sorted(line.split()[-1] for line in lines if line.startswith("config ")) == ["chain", "ddtree", "plain"]


def test_tune_dry_run_measures_and_writes_nothing(box) -> None:
    run, host_file, _, _ = box
    text = host_file.read_text()
    res = run("tune", "--host", NAME, "--batch-sizes", "1", "--budgets", "16", *WORK, "--dry-run", "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["written"] is False and host_file.read_text() == text
    assert [r["batch"] for r in doc["table"]] == [1]
    for r in doc["table"]:
        assert {"plain_tok_s", "chain_tok_s", "b16_tok_s"} <= set(r) and r["chosen_budget"] in (0, 16)
    prof = doc["accept_profile"]
    assert len(prof) == 7 and all(len(p) == 8 and sum(p) <= 1.0 + 1e-6 for p in prof)
    assert prof[0][0] > 0  # the drafter's first rank is often the target's token
    assert {(m["config"], m["batch"]) for m in doc["measurements"]} == {
        (c, 1) for c in ("ddtree-16", "chain", "plain")}
    # the server already ran budget 16: measured as it was; restarted for the chain, plain, and back
    assert doc["restored"]["same_config"] and doc["restored"]["restarts"] == 3
    assert _info(host_file)["speculative_ddtree_budget"] == 16
    if not doc["unchanged"]:
        assert f"+  ddtree_flags: --speculative-algorithm DFLASH --speculative-ddtree-budget {doc['schedule']}" \
            in doc["diff"]


def test_tune_writes_the_schedule_keeping_the_file_and_apply_restarts_on_it(box) -> None:
    run, host_file, _, _ = box
    text = host_file.read_text()
    res = run("tune", "--host", NAME, "--batch-sizes", "1,2", "--budgets", "4,16", *WORK, "--margin", "0", "--apply")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "tok/s by budget x batch" in res.stdout and "schedule:" in res.stdout
    schedule = res.stdout.split("schedule: ", 1)[1].split()[0]
    new = host_file.read_text()
    if new == text:  # the fit kept budget 16 for every size: nothing to write
        assert "already runs this schedule" in res.stdout
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
    assert _info(host_file)["pid"] == pid


def test_server_down_is_said_and_stays_down(box) -> None:
    run, host_file, _, _ = box
    assert run("server", "stop", NAME).returncode == 0
    try:
        for cmd in ("bench", "tune"):
            _one_line_error(run(cmd, "--host", NAME, *WORK), 1, "server is not up")
        assert _info(host_file) == {}  # still down: nothing was started behind the user's back
    finally:
        assert run("server", "start", NAME).returncode == 0


def test_ctrl_c_during_bench_leaves_the_server_as_configured(box) -> None:
    _, host_file, env, wheel_env = box
    """Interrupted while the server restarts for plain decoding: the host's guardian puts it back as configured."""
    proc = subprocess.Popen([str(wheel_env.script), "bench", "--host", NAME, *WORK], env=wheel_env.env(**env),
                            cwd=wheel_env.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 300
    while "restarting the server for plain" not in seen and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert "restarting the server for plain" in seen, seen
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, seen + err
    assert "Traceback" not in err
    info = _info(host_file)
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_ddtree_budget"] == 16


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
