"""bench/e2e/driver.py sizes the dummy-weight 8B-shape engines for the card it runs on: the same bytes as 0.22 of an
H200 (an 80 GiB H100 refused every engine at 0.22: bench/results/round-overhead-h100-attribution-start-refused.json),
0.22 where it sees no GPU, never above 0.9, and E2E_MEM_FRACTION_BIG still overrides."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.e2e import driver  # noqa: E402


def test_fraction_follows_the_card():
    h200, h100 = int(139.8 * 2**30), int(79.6 * 2**30)
    assert driver.big_mem_fraction(h200) == 0.22
    assert driver.big_mem_fraction(h100) == 0.386
    assert driver.big_mem_fraction(0) == 0.22
    assert driver.big_mem_fraction(16 * 2**30) == 0.9  # a small card: capped, the engine says what it needs


def test_the_environment_overrides(monkeypatch):
    monkeypatch.setenv("E2E_MEM_FRACTION_BIG", "0.5")
    assert driver.engine_kwargs(driver.parse("q8b-chain-graph"))["mem_fraction_static"] == 0.5
    monkeypatch.delenv("E2E_MEM_FRACTION_BIG")
    assert driver.engine_kwargs(driver.parse("q8b-chain-graph"))["mem_fraction_static"] == driver.big_mem_fraction()
