"""The benchmark-only start-up hooks (bench/e2e/gdn_unpacked_decode, profile_weights; round_stats_hook has its own
tests) through their one import hook (bench.e2e.import_hook), in real subprocesses laid out as the driver lays out
an Engine's processes (driver.config_env's PYTHONPATH), against stand-in SGLang modules of the same names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.e2e import driver

ROOT = Path(__file__).resolve().parents[2]


def _module(site: Path, dotted: str, src: str) -> None:
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        pkg = site.joinpath(*parts[:i])
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").touch()
    site.joinpath(*parts[:-1], parts[-1] + ".py").write_text(textwrap.dedent(src))


def _run(env: dict, script: str) -> subprocess.CompletedProcess:
    # cwd elsewhere: only PYTHONPATH may make bench importable, as in SGLang's own processes
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=120, cwd="/")


def _env(monkeypatch, site: Path, name: str, hooked: bool = True) -> dict:
    monkeypatch.setenv("PYTHONPATH", str(site))
    env = driver.config_env(driver.parse(name))
    path = env["PYTHONPATH"].split(os.pathsep)
    assert (path[-1] == str(ROOT)) == hooked  # with a hook the root goes last (it shadows nothing), else not at all
    return env


def test_arv_turns_the_packed_gdn_decode_off(tmp_path, monkeypatch):
    _module(tmp_path / "site", "sglang.srt.layers.attention.linear.kernels.gdn_triton", '''
        class TritonGDNKernel:
            supports_packed_decode = True
        ''')
    env = _env(monkeypatch, tmp_path / "site", "hyblive-arv")
    r = _run(env, '''
        from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
        print("packed", TritonGDNKernel.supports_packed_decode)
        ''')
    assert r.returncode == 0, r.stderr[-3000:]
    assert "packed False" in r.stdout and "GDN packed decode off" in r.stderr
    plain = _env(monkeypatch, tmp_path / "site", "hyblive-ar", hooked=False)  # plain decoding keeps the packed kernel
    assert plain["PYTHONPATH"] == str(tmp_path / "site")


def test_prof_models_get_the_profile_after_the_dummy_fill(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    _module(tmp_path / "site", "sglang.srt.model_loader.loader", '''
        import torch

        def initialize_dummy_weights(model, low=-1e-3, high=1e-3):
            for p in model.parameters():
                p.data.uniform_(low, high)
        ''')
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"tokens": [3, 5], "lm_head_col0": [2.0, 1.0], "lm_head_col0_other": -24.0}))
    env = {**_env(monkeypatch, tmp_path / "site", "prof-chain-graph"), "E2E_PROFILE_JSON": str(profile)}
    r = _run(env, '''
        import json, torch
        from sglang.srt.model_loader.loader import initialize_dummy_weights
        m = torch.nn.Module()
        for name, shape in (("o_proj", (4, 4)), ("norm", (4,)), ("embed_tokens", (8, 4)), ("lm_head", (8, 4)),
                            ("q_proj", (4, 4))):
            sub = torch.nn.Module()
            sub.weight = torch.nn.Parameter(torch.empty(shape))
            m.add_module(name, sub)
        initialize_dummy_weights(m)
        print(json.dumps({n: p.tolist() for n, p in m.named_parameters()}))
        ''')
    assert r.returncode == 0, r.stderr[-3000:]
    w = json.loads(r.stdout)
    assert w["o_proj.weight"] == [[0.0] * 4] * 4 and w["norm.weight"] == [1.0] * 4
    assert all(row == [1.0, 0.0, 0.0, 0.0] for row in w["embed_tokens.weight"])
    assert [row[0] for row in w["lm_head.weight"]] == [-24.0, -24.0, -24.0, 2.0, -24.0, 1.0, -24.0, -24.0]
    assert any(x != 0.0 for row in w["q_proj.weight"] for x in row)  # untouched: still the random fill
    assert "set 4 tensors" in r.stderr


def test_a_hook_without_the_repository_root_stops_the_process(tmp_path, monkeypatch):
    env = _env(monkeypatch, tmp_path / "site", "hyblive-arv")
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p != str(ROOT))
    r = _run(env, 'print("ran")')
    assert r.returncode != 0 and "ran" not in r.stdout
    assert "bench/e2e/gdn_unpacked_decode" in r.stderr and "repository root must be on PYTHONPATH" in r.stderr
