"""bench/bench_attention_spills.py refuses a results folder that does not exist, writing nothing. (Its run compiles
SGLang's kernel from the real wheel: `python bench/bench_attention_spills.py` regenerates the committed table; DDTree's
kernel alone is held spill-free by tests/runtime/test_tree_attn_compile.py, in the suite.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_refuses_a_missing_folder(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_attention_spills.py"), "--out",
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no such folder" in r.stderr
