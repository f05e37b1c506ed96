"""What people read at 80 columns and while they wait (issue 25, findings 6 and 9), through the installed console
script: ids, numbers and versions are never split or cut (a key-value layout when a table does not fit, ``-o wide``
for the full width), help keeps default paths whole, and a server that takes seconds to start shows the elapsed
time and its last log line, while ``--json`` stays pure JSON.

The sandbox part runs on a copy of the sandbox's base host (its own name, release root and server port, the same
sshd), whose reference engine waits 14 s before it loads, as a large checkpoint would.
"""
from __future__ import annotations

import io
import json
import os
import random
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hostcopy import base_host_doc, new_inventory
from rich.console import Console
from rich.text import Text

from ddtree_deploy.console import table

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "kernel-pins-other-torch.json"
NAME = "tablebox"
NARROW = {"COLUMNS": "80"}


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _assert_fits(text: str) -> None:
    too_long = [line for line in _lines(text) if len(line) > 80]
    assert not too_long, too_long
    assert "…" not in text, text


def test_abi_findings_keep_the_torch_version_whole_at_80_columns(cli) -> None:
    proc = cli("abi", "--facts", str(FACTS), **NARROW)
    assert proc.returncode == 4, proc.stderr
    _assert_fits(proc.stdout)
    # the version to install, on one line, whole (the old table cut it to `torch==2.…`)
    assert any("install torch==2.9.1 " in line for line in _lines(proc.stdout)), proc.stdout
    assert any("2.11.0+cu130" in line for line in _lines(proc.stdout)), proc.stdout


def test_wide_prints_each_finding_on_one_line(cli) -> None:
    for flags in (["-o", "wide"], ["--wide"]):
        proc = cli("abi", "--facts", str(FACTS), *flags, **NARROW)
        assert proc.returncode == 4, proc.stderr
        row = [line for line in _lines(proc.stdout) if "torch-pins" in line]
        assert len(row) == 1 and "kernel-pins-other-torch" in row[0] and "install torch==2.9.1" in row[0], proc.stdout
        assert len(row[0]) > 80


def test_help_keeps_default_paths_whole_at_80_columns(cli) -> None:
    proc = cli("sandbox", "up", "--help", **NARROW)
    assert proc.returncode == 0, proc.stderr
    _assert_fits(proc.stdout)
    joined = "".join(line.strip("│ ") for line in _lines(proc.stdout))
    assert "~/.local/state/ddtree-deploy/sandbox" in joined, proc.stdout


def test_no_table_splits_a_word_at_any_width() -> None:
    """The layout rule itself, over random tables and widths: every line fits, and every word (an id, a number, a
    version, a release id; prose words up to 40 characters) stands whole on one line, in table and key-value form."""
    words = ["torch==2.9.1", "install", "the", "sgl-kernel", "r-20260101T010203-abcdef12", "CUDA", "1569.41",
             "/opt/ddtree/releases", "2.11.0+cu130", "[green]pass[/green]", "4f3a2b1c0d9e"]
    rng = random.Random(7)
    layouts = set()
    for _ in range(400):
        columns = [rng.choice(["id", "host", "message", "fix", "why it breaks", "seconds", "rolled back to"]) + str(i)
                   for i in range(rng.randint(1, 8))]
        rows = [[" ".join(rng.choices(words, k=rng.randint(1, 6))) if rng.random() < 0.5 else rng.choice(words)
                 for _ in columns] for _ in range(rng.randint(1, 3))]
        width = rng.randint(30, 160)
        console = Console(width=width, file=io.StringIO(), record=True)
        console.print(table("t", columns, rows))
        lines = console.export_text().splitlines()
        layout = "table" if any("┃" in line for line in lines) else "key-value"
        layouts.add(layout)
        room = width if layout == "table" else width - max(len(c) for c in columns) - 2
        assert all(len(line) <= width for line in lines)
        for word in {w for row in rows for cell in row for w in Text.from_markup(cell).plain.split()}:
            assert len(word) > room or any(word in line for line in lines), (word, width, columns, lines)
    assert layouts == {"table", "key-value"}


@pytest.fixture(scope="module")
def box(sandbox, wheel_env, tmp_path_factory):
    root, inv = new_inventory(tmp_path_factory, "tables")
    doc = base_host_doc(sandbox, NAME, "/srv/ddtree-host/table-releases")
    doc["server"]["command"] = doc["server"]["command"].replace("{ddtree_flags}", "--load-delay 14 {ddtree_flags}")
    (inv / f"{NAME}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    # a second host whose file is bad: `apply --all` then prints the fleet recap, with its long message
    (inv / "broken.yaml").write_text("python: /usr/bin/python3\nsite_packages: /usr/lib/python3/dist-packages\n")
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(root / "snapshots")}

    def run(*args: str, timeout: float = 600, **extra: str):
        return wheel_env.run(*args, timeout=timeout, **env, **extra)

    run.env = env  # type: ignore[attr-defined]
    yield run
    run("server", "stop", NAME, timeout=120)


@pytest.mark.sandbox
@pytest.mark.slow
def test_apply_shows_the_wait_and_a_recap_that_keeps_ids_whole(box) -> None:
    run = box
    proc = run("apply", "--all", "--ignore-abi", **NARROW)  # the sandbox has no torch in the patch set's range
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]  # the bad host file: exit 2, the rest done
    # the start-up wait, where stderr is not a terminal: plain lines with the elapsed time and the server's last line
    waits = [line for line in _lines(proc.stderr) if re.match(rf"^{NAME}: probe stage startup: \d+ s elapsed", line)]
    assert waits, proc.stdout + proc.stderr
    assert any("last log line:" in w and "(loading)" in w for w in waits), waits
    releases = json.loads(run("releases", NAME, "--json").stdout)
    release = releases["state"]["active"]
    assert release
    _assert_fits(proc.stdout)
    assert any(release in line for line in _lines(proc.stdout)), proc.stdout  # the release id whole, on one line
    # the recap's message is prose: whole words, several to a line (not one word per line), never cut at 90
    message = [line for line in _lines(proc.stdout) if "bad host file:" in line]
    assert message and len(message[0].split()) >= 4, proc.stdout
    assert "missing required field 'release_root'" in " ".join(proc.stdout.split()), proc.stdout

    snaps = run("snapshot", "list", NAME, **NARROW)
    assert snaps.returncode == 0, snaps.stderr
    _assert_fits(snaps.stdout)
    ids = [s["id"] for s in json.loads(run("snapshot", "list", NAME, "--json").stdout)]
    assert ids and all(any(i in line for line in _lines(snaps.stdout)) for i in ids), snaps.stdout

    # a second run is "unchanged" and probes the running server; --json keeps stdout pure JSON
    again = run("apply", "--host", NAME, "--ignore-abi", "--json", **NARROW)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert json.loads(again.stdout)["host"] == NAME


def _in_a_terminal(wheel_env, *args: str, env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run the installed script with a pseudo-terminal as stdin, stdout and stderr (what a person's shell gives)."""
    master, slave = os.openpty()
    proc = subprocess.Popen([str(wheel_env.script), *args], stdin=slave, stdout=slave, stderr=slave, cwd=wheel_env.workdir,
                            env=wheel_env.env(TERM="xterm", **env))
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the other side is closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"{args} did not finish within {timeout} s")
    finally:
        os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.sandbox
@pytest.mark.slow
def test_snapshot_in_a_terminal_shows_the_manifest_as_a_count_of_files(box, wheel_env) -> None:
    code, text = _in_a_terminal(wheel_env, "snapshot", "take", NAME, "--refresh", env={**box.env, **NARROW})
    assert code == 0, text[-3000:]
    # the manifest stage (the host listing and hashing every file) is a spinner and a count, never `0/? bytes`
    assert re.search(r"listing files|\d+ files", text), text[-3000:]
    assert "/? bytes" not in text, text[-3000:]
    latest = json.loads(box("snapshot", "list", NAME, "--json").stdout)[-1]["id"]
    assert latest in text, text[-3000:]  # the table that follows keeps the id whole in the terminal's width too
