"""Stage 2, ``selftest`` (no server needed): the runtime's ``self_test("cuda")`` on the host GPU; skipped (and said
so) without a GPU or without a runtime (the overlay stage says which)."""

from __future__ import annotations

import time

from ..errors import ConnectionCut, DeployError
from ..inventory import probe_setting
from .result import ProbeRun, Probing, Stage
from .sources import RUNTIME_SUBDIR

NAME = "selftest"
NEEDS_SERVER = False


def _gpu(p: Probing, ctx: ProbeRun) -> tuple[bool, str]:
    if p.facts is not None:
        gpus = p.facts.get("gpus")
        if gpus is not None and not gpus:
            return False, "the host's facts list no GPU"
    got = ctx.gpu_info
    if got is None:
        try:
            got = p.conn.call("probe", "gpu", timeout=60)
        except DeployError as exc:
            if isinstance(exc, ConnectionCut):
                raise
            return False, f"cannot query nvidia-smi: {exc}"
    return bool(got.get("present")), got.get("why", ", ".join(got.get("gpus", [])))


def run(p: Probing, release: str | None, ctx: ProbeRun) -> Stage:
    t0 = time.monotonic()
    if release is None or not ctx.runtime_present:
        return Stage(NAME, "skip", 0.0, "no DDTree runtime active")
    present, why = _gpu(p, ctx)
    if not present:
        return Stage(NAME, "skip", time.monotonic() - t0, f"skipped: no GPU on this host ({why})")
    budget = float(probe_setting(p.host, "selftest_timeout"))
    try:
        got = p.call("selftest", budget, root=p.host.release_root, env=p.host.server.get("env") or {},
                     runtime_subdir=RUNTIME_SUBDIR, budget=budget)
    except DeployError as exc:
        if isinstance(exc, ConnectionCut):
            raise
        return Stage(NAME, "fail", time.monotonic() - t0, str(exc))
    result = got.get("selftest") or {}
    seconds = time.monotonic() - t0
    if got.get("import_error"):
        return Stage(NAME, "fail", seconds, "loading the runtime for the self-test failed", log_tail=got["import_error"])
    if not result.get("ok"):
        bad = [k for k, v in (result.get("checks") or {}).items() if not v]
        return Stage(NAME, "fail", seconds, f"kernel self-test failed on {result.get('device')}: {', '.join(bad) or result.get('error')}",
                     {"selftest": result})
    return Stage(NAME, "pass", seconds, f"kernels agree with references on {result.get('device')} (impl {result.get('impl')})",
                 {"selftest": result})
