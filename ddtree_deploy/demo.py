"""`make demo`: the main job, end to end, on the built-in local sandbox hosts.

Each step runs the real ``ddtree-deploy`` command line, as a user would, and the demo stops at the first step
that fails, with that step's exit code.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

from .console import out, table


@dataclass
class Step:
    title: str
    argv: list[str]
    expect: int = 0  # the exit code this step must end with


def steps() -> list[Step]:
    cli = [sys.executable, "-m", "ddtree_deploy"]
    return [
        Step("start the sandbox hosts (sshd on loopback, real SGLang installed)", cli + ["sandbox", "up"]),
        Step("check every sandbox host answers", cli + ["hosts", "check", "sandbox-base", "sandbox-drift"]),
    ]


def main() -> int:
    results = []
    for step in steps():
        out.rule(f"[bold]{step.title}")
        out.print("$ " + " ".join(["ddtree-deploy"] + step.argv[3:]), style="dim")
        start = time.monotonic()
        code = subprocess.call(step.argv)
        seconds = time.monotonic() - start
        ok = code == step.expect
        results.append([step.title, f"{code} (expected {step.expect})", f"{seconds:.1f}s", "ok" if ok else "FAILED"])
        if not ok:
            out.print(table("demo summary", ["step", "exit", "time", "result"], results))
            return code or 1
    out.print(table("demo summary", ["step", "exit", "time", "result"], results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
