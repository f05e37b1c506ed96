"""bench/bench_attention_spills.py on the real SGLang 0.5.17 wheel: it compiles SGLang's extend kernel (causal and
custom-mask forms) and DDTree's tree-verify kernel for sm_90a on the CPU and writes the table; the committed result's
ordering holds (SGLang's kernel spills more with a tree mask; DDTree's at most 16 bytes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.wheels
def test_spill_table_from_the_real_wheel(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_attention_spills.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "verify-attention-spills.json").read_text())["rows"]
    by = {(x["shape"], x["kernel"]): x["spill_bytes"] for x in rows}
    for shape in ("q8b-b16", "q8b-b64", "q36-b16"):
        assert by[(shape, "ddtree (splits 1)")] <= 16 and by[(shape, "ddtree (splits 16)")] <= 16
        assert by[(shape, "sglang-mask")] > by[(shape, "ddtree (splits 1)")]
    assert by[("q8b-b16", "sglang-mask")] > by[("q8b-b16", "sglang-causal")] > 0
    assert "| Qwen3-8B, b16 (17 verified) | sglang-mask |" in (tmp_path / "verify-attention-spills.md").read_text()


def test_refuses_a_missing_folder(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_attention_spills.py"), "--out",
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no such folder" in r.stderr
