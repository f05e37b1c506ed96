"""Fail-fast probes of a host's server after a deploy (and on demand): four stages, each with its own budget and its
own module (``overlay``, ``selftest``, ``startup``, ``generation``), run by ``prober.Prober``.

1. ``overlay``   the server's Python, with the server's environment, resolves ``sglang`` to the active release
                 and loads the DDTree package from it by file path (never importing sglang: that needs the GPU
                 stack); its ``__version__`` is reported.
2. ``selftest``  the runtime's ``self_test("cuda")`` on the host GPU; skipped (and said so) without a GPU.
3. ``startup``   pid + log + ``/health`` polled ON the host every ~100 ms in one remote call: a dead process or a
                 traceback in the log fails at once, ``/health`` 200 must come within the start-up budget, and a
                 start whose log stays silent while /health fails for ``probe.startup_stall_timeout`` seconds is
                 wedged and fails then (a real model load keeps logging, so it keeps its whole budget). A server we
                 did not start answering on the port is named as such.
4. ``generation`` fixed prompts at temperature 0 must match the recorded baseline token for token; the
                 speculative acceptance length from ``meta_info.spec_accept_length`` is reported.

After the stages the result carries what the user sees of DDTree (``ProbeResult.ddtree``): the active budget (or
schedule), the acceptance length (the probe's replies and the server's own ``avg_spec_accept_length``) and tok/s
(the probe's replies: their output tokens over their wall time), read from SGLang's ``/get_server_info``. SGLang's
``last_gen_throughput`` is kept in the JSON only (``server_last_gen_throughput``): it is the scheduler's last
decode-log interval, idle time counted, so it reads 0.0 or a few tok/s right after the probe's requests.

``check_release`` runs the stages that need no server (1, 2), ``check_serving`` the ones that do (3, 4), each read
off the stage list (``prober.STAGE_MODULES``: a stage module says whether it needs the server): the deploy restarts
the server between them. What the stages hand each other in one probe is a ``result.ProbeRun``; ``result`` also
holds ``Stage`` and ``ProbeResult``; ``sources`` where the probe and the host's guardian look on the host. Baselines
(what generation compares against) are recorded by ``baseline``.
"""

from __future__ import annotations

from .prober import STAGE_MODULES, STAGES, Prober
from .result import ProbeResult, ProbeRun, Stage
from .sources import RUNTIME_SUBDIR, expected_sglang_dir, guard_spec, log_source, pid_source

__all__ = ["Prober", "ProbeResult", "ProbeRun", "RUNTIME_SUBDIR", "STAGES", "STAGE_MODULES", "Stage",
           "expected_sglang_dir", "guard_spec", "log_source", "pid_source"]
