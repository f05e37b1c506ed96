"""The generation baseline: what the probe's generation stage compares against, recorded on the host.

Baselines live on the host, in ``<release_root>/probe-baseline.json`` (``hoststate.HostLayout.baseline``): they describe that host's model and server,
they survive a change of control machine, and every deploy to the host compares against the same file. Recording
one restarts the server (DDTree off by default: the tokens of a non-speculative greedy run are the lossless
reference), generates the fixed prompts and restarts the server as configured; it runs under the host lock
(``probe --record-baseline``, or ``apply`` on a host that has none yet).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import OperationFailed
from .hoststate import HostLayout, ReleaseState
from .inventory import probe_setting
from .launch_check import check_launch_line

if TYPE_CHECKING:
    from .probe import Prober
    from .server import ServerControl


def record_baseline(prober: Prober, ctl: ServerControl, *, ddtree: bool = False) -> dict[str, Any]:
    """Restart the server (DDTree off unless ``ddtree``), generate the fixed prompts, store the replies on the host,
    then restart it as configured. Returns the recorded document."""
    host, conn = prober.host, prober.conn
    prompts = list(host.probe.get("prompts") or [])
    if not prompts:
        raise OperationFailed(f"{host.source}: probe.prompts is empty; nothing to record")
    active = ReleaseState.read(conn, host).active
    # the line this restart starts, parsed by the SGLang it runs, before anything is stopped (launch_check)
    check_launch_line(conn, host, active, ddtree=ddtree)
    ctl.restart(release=active, ddtree=ddtree)
    try:
        start = prober.startup(active if ddtree else None)
        if start.status != "pass":
            raise OperationFailed(f"host {host.name}: cannot record a baseline: {start.detail}\n{start.log_tail}")
        replies = prober.generate()
    finally:
        ctl.restart(release=active, ddtree=active is not None)
    doc = {"recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host.name, "ddtree": ddtree,
           "release": active, "prompts": prompts, "max_new_tokens": int(probe_setting(host, "max_new_tokens")),
           "outputs": [{"prompt": r["prompt"], "output_ids": r.get("output_ids"), "text": r.get("text")} for r in replies]}
    conn.call("probe", "write_json", timeout=30, path=HostLayout.of(host).baseline, data=doc)
    return doc
