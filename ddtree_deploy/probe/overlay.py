"""Stage 1, ``overlay`` (no server needed): the server's Python, with the server's environment, resolves ``sglang`` to
the active release and loads the DDTree package from it by file path (never importing sglang: that needs the GPU
stack); its ``__version__`` is reported. Tells the self-test whether a runtime is there and what GPU the host has."""

from __future__ import annotations

import time

from ..errors import ConnectionCut, DeployError
from ..inventory import probe_setting
from .result import ProbeRun, Probing, Stage
from .sources import RUNTIME_SUBDIR, expected_sglang_dir

NAME = "overlay"
NEEDS_SERVER = False


def run(p: Probing, release: str | None, ctx: ProbeRun) -> Stage:
    t0 = time.monotonic()
    budget = float(probe_setting(p.host, "overlay_timeout"))
    try:
        got = p.call("inspect", budget, root=p.host.release_root, env=p.host.server.get("env") or {},
                     runtime_subdir=RUNTIME_SUBDIR, expect=expected_sglang_dir(p.host, release),
                     load=release is not None, budget=budget)
    except DeployError as exc:
        if isinstance(exc, ConnectionCut):
            raise
        return Stage(NAME, "fail", time.monotonic() - t0, str(exc))
    want = expected_sglang_dir(p.host, release)
    got_dir = got.get("sglang_real")
    data = {k: got.get(k) for k in ("executable", "sglang", "sglang_real", "runtime_version", "runtime_file", "pythonpath")}
    seconds = time.monotonic() - t0
    if got_dir is None:
        return Stage(NAME, "fail", seconds, f"the server's Python ({got.get('executable')}) finds no sglang", data)
    if got_dir != got.get("expect_real"):
        return Stage(NAME, "fail", seconds,
                     f"the server's Python resolves sglang to {got_dir}, expected {want} "
                     f"({'release ' + release if release else 'the installed package'})", data)
    if release is None:
        ctx.runtime_present = False
        return Stage(NAME, "pass", seconds, f"no overlay active: sglang from the installed package {got_dir}", data)
    if not got.get("runtime_present"):
        return Stage(NAME, "fail", seconds, f"release {release} has no DDTree package at {got.get('runtime_dir')}", data)
    if got.get("import_error"):
        return Stage(NAME, "fail", seconds, "loading the DDTree package from the release failed",
                     data, log_tail=got["import_error"])
    version = got.get("runtime_version")
    if not isinstance(version, str) or not version:
        return Stage(NAME, "fail", seconds, f"DDTree package at {got.get('runtime_file')} has no __version__", data)
    ctx.runtime_present = True
    ctx.gpu_info = got.get("gpu")
    return Stage(NAME, "pass", seconds, f"sglang from release {release}; DDTree runtime {version}", data)
