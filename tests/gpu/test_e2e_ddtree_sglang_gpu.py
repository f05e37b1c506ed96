"""DDTree in the real SGLang 0.5.11 server on a CUDA host (marked ``gpu``; skipped without CUDA or the bundle).

What it needs: a CUDA GPU, the offline SGLang bundle copied to ``.e2e/`` (``cp -r shared/gpu-e2e .e2e``) and the
overlay built into ``.e2e/overlay`` (``ddtree-deploy patchset build ddtree --base sglang==0.5.11 --out .e2e/overlay``). It runs
``bench/e2e/gpu_run.sh`` on a small set of configurations (several Engine processes in parallel, ~3 minutes on an
H200) and checks the report: greedy output identical to autoregressive decoding for every DDTree budget and batch,
a stop token inside the accepted path honoured, and DDTree acceptance above the DFlash chain at the same drafter and
rising with the budget (agreeing tiny models, bench/e2e/models/mk_agree.py). Speed is measured by the bench, never here.
Run it with ``python -m pytest -m gpu tests/gpu/test_e2e_ddtree_sglang_gpu.py`` (or ``make test-gpu``).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = "agree-ar,agree-chain,agree-ddtree-b4,agree-ddtree-b15,agree-ddtree-b64,agree-ddtree-b64-graph"


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch missing"
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if not (ROOT / ".e2e" / "wheels").is_dir() or not (ROOT / ".e2e" / "overlay" / "sglang").is_dir():
        return "needs the offline bundle in .e2e/ and the overlay in .e2e/overlay/ (see the module docstring)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]


def _run() -> dict:
    out = Path(tempfile.mkdtemp(prefix="ddtree-e2e-"))
    env = {**os.environ, "OUT": str(out), "E2E_WORKERS": "6", "E2E_DEADLINE": "420"}
    r = subprocess.run(["bash", "bench/e2e/gpu_run.sh", "gputest", CONFIGS], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    rep = out / "gputest.json"
    assert rep.is_file(), r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(rep.read_text())


def test_ddtree_lossless_and_accepts_more_than_the_chain():
    s = _run()
    for name in CONFIGS.split(","):
        assert s["configs"].get(name, {}).get("ok"), (name, s["configs"].get(name))
    for name, wls in s["lossless"].items():
        for wl, v in wls.items():
            assert v["identical"], (name, wl, v)
    assert {"greedy-bs1", "greedy-bs4", "greedy-bs16", "stop-bs4"} <= set(s["lossless"]["agree-ddtree-b64"])
    # AR has only its T > 0 workload's (empty) acceptance entry; compare the speculative configurations.
    acc = {n: w["greedy-bs16"]["accepted_per_round"] for n, w in s["acceptance"].items() if "greedy-bs16" in w}
    assert acc["agree-ddtree-b15"] > acc["agree-chain"]
    assert acc["agree-ddtree-b64"] > acc["agree-ddtree-b15"] >= acc["agree-ddtree-b4"] >= acc["agree-chain"]
    assert acc["agree-ddtree-b64-graph"] == acc["agree-ddtree-b64"]

