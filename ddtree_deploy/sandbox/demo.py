"""`make demo`: the main job, end to end, on the built-in local sandbox hosts.

Each step runs the real ``ddtree-deploy`` command line, as a user would, against real sshd hosts with real SGLang
releases installed; the server on those GPU-less hosts is the DDTree reference engine, which decodes with the
runtime of whatever release is active. The story:

1. start the sandbox hosts and check they answer;
2. snapshot both hosts (facts + manifest + content) and compare their ABI facts;
3. check the DDTree patch set applies to the base host's snapshot;
4. apply it: push an overlay release, restart, probe (acceptance length shown) — must pass;
5. apply a deliberately broken overlay (its runtime raises on import): the probe fails fast and the host is
   rolled back automatically (exit 1 expected);
6. probe again: the good release is active and healthy;
7. stop everything (``DEMO_KEEP=1`` keeps the sandbox running for a look around).

The demo stops at the first step whose exit code is not the expected one and exits with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.table import Table

from ..console import out

BASE, DRIFT = "sandbox-base", "sandbox-drift"
BROKEN = Path(__file__).resolve().parents[2] / "tests" / "patchsets" / "broken-runtime" / "sglang-0.5.11"


@dataclass
class Step:
    title: str
    args: list[str] | Callable[[], list[str]]
    expect: int = 0  # the exit code this step must end with
    notes: list[str] = field(default_factory=list)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddtree_deploy", *args]


def _latest_snapshot(host: str) -> str:
    listing = json.loads(subprocess.run(_cli("snapshot", "list", host, "--json"), capture_output=True, text=True, check=True).stdout)
    return max(listing, key=lambda s: s["created"])["id"]


def steps() -> list[Step]:
    final = [] if os.environ.get("DEMO_KEEP") else [Step("stop servers and remove the sandbox (DEMO_KEEP=1 keeps it)", ["sandbox", "down"])]
    return [
        Step("start the sandbox hosts (sshd on loopback, real SGLang 0.5.11 and 0.5.23 installed)", ["sandbox", "up"]),
        Step("check every sandbox host answers", ["hosts", "check", BASE, DRIFT]),
        Step("snapshot the installed SGLang of both hosts (facts, manifest, content)", ["snapshot", BASE, DRIFT]),
        Step("compare the hosts' ABI facts", ["abi", BASE, DRIFT]),
        Step("check the DDTree patch set applies to the base host's snapshot",
             lambda: ["patchset", "check", "ddtree", "--snapshot", _latest_snapshot(BASE)]),
        Step("apply DDTree to the base host: push release, restart, probe", ["apply", "--host", BASE]),
        Step("apply a broken overlay: probe fails fast, automatic rollback (exit 1 expected)",
             ["apply", "--host", BASE, "--patchset", str(BROKEN)], expect=1),
        Step("probe the base host again: the good release is back and healthy", ["probe", BASE]),
        Step("the host's releases: active, previous good, bad", ["releases", BASE]),
        *final,
    ]


def summary_table(results: list[list[str]], seconds: float) -> Table:
    """The demo's recap. The step column wraps; exit, time and result never do, so at 80 columns every row still
    ends with its exit code, time and verdict on one line."""
    t = Table(title=f"demo summary ({seconds:.0f}s)", title_justify="left", header_style="bold")
    t.add_column("step", ratio=1, overflow="fold")
    for name, justify in (("exit", "left"), ("time", "right"), ("result", "left")):
        t.add_column(name, no_wrap=True, justify=justify)  # type: ignore[arg-type]
    for row in results:
        t.add_row(*row)
    return t


def main() -> int:
    env = dict(os.environ)
    if not sys.stdout.isatty():
        env.setdefault("COLUMNS", "150")  # readable tables in logs
    results: list[list[str]] = []
    started = time.monotonic()
    code = 0
    for step in steps():
        argv = step.args() if callable(step.args) else step.args
        out.rule(f"[bold]{step.title}")
        out.print("$ ddtree-deploy " + " ".join(argv), style="dim", highlight=False)
        start = time.monotonic()
        code = subprocess.call(_cli(*argv), env=env)
        seconds = time.monotonic() - start
        ok = code == step.expect
        results.append([step.title, str(code) if code == step.expect == 0 else f"{code} (want {step.expect})",
                        f"{seconds:.1f}s", "ok" if ok else "FAILED"])
        if not ok:
            break
    else:
        code = 0
    out.rule("[bold]demo summary")
    out.print(summary_table(results, time.monotonic() - started))
    if code:
        out.print("[red]the demo stopped at the failed step; the sandbox is left running for inspection "
                  "(`ddtree-deploy sandbox down` removes it)[/red]")
        return code if code else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
