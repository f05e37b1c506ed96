"""The HTTP server, run the way a sandbox host runs it: a copied package, a subprocess, a loopback port."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path

import ddtree_refengine
import pytest
from ddtree_refengine import tokenizer
from ddtree_refengine.decode import Engine, SamplingParams
from ddtree_refengine.models import ModelConfig, build_target
from refengine_helpers import LISTENING_RE, RUNTIME_DIR, start_server

TIMEOUT = 30


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post(url: str, body: dict | bytes) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def release_dir(tmp_path) -> Path:
    """A release as deploy builds it: an sglang package (here one that must not be imported) vendoring the runtime."""
    release = tmp_path / "release"
    sglang = release / "sglang"
    sglang.mkdir(parents=True)
    (sglang / "__init__.py").write_text("raise ImportError('the engine must not import sglang')\n")
    shutil.copytree(RUNTIME_DIR, sglang / "srt" / "speculative" / "ddtree", ignore=shutil.ignore_patterns("__pycache__"))
    return release


@pytest.fixture
def ddtree_server(site_dir, release_dir, tmp_path):
    """DDTREE with the runtime found the deployed way: find_spec('sglang') on PYTHONPATH, no override."""
    server = start_server(
        site_dir, tmp_path,
        ["--speculative-algorithm", "DDTREE", "--ddtree-budget", "16", "--block-size", "8", "--seed", "0"],
        {"PYTHONPATH": f"{site_dir}{os.pathsep}{release_dir}"},
    )
    yield server
    server.stop()


def test_ddtree_server_endpoints_generation_and_sigterm(ddtree_server, release_dir, runtime):
    srv = ddtree_server
    assert srv.port is not None, srv.proc.stderr.read()
    assert int(srv.pid_file.read_text()) == srv.proc.pid

    status, body = _get(srv.url + "/health")
    assert (status, body) == (200, b"")

    status, raw = _get(srv.url + "/get_server_info")
    info = json.loads(raw)
    assert status == 200 and info["ready"] is True
    assert info["version"] == ddtree_refengine.__version__
    assert info["speculative_algorithm"] == "DDTREE" and info["speculative_ddtree_budget"] == 16
    assert info["speculative_ddtree_schedule_hold"] == 8  # the runtime's default, as the SGLang patch set's
    assert info["ddtree_runtime_path"] == str((release_dir / "sglang" / "srt" / "speculative" / "ddtree").resolve())
    assert info["ddtree_runtime_version"] == runtime.__version__

    prompt = "The deploy probe says hello"
    status, out = _post(srv.url + "/generate", {
        "text": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
    assert status == 200
    expected = Engine(build_target(ModelConfig(seed=0)), "NONE").generate(
        tokenizer.encode(prompt), SamplingParams(24, 0.0)).output_ids
    assert out["output_ids"] == expected  # the server's DDTree decode == greedy AR in this process
    assert out["text"] == tokenizer.decode(expected)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(tokenizer.encode(prompt))
    assert meta["completion_tokens"] == 24
    assert meta["finish_reason"] == {"type": "length", "length": 24}
    assert 1 <= meta["spec_verify_ct"] < 24 and meta["spec_accept_length"] > 1.0

    stop = expected[5]
    status, out = _post(srv.url + "/generate", {
        "input_ids": tokenizer.encode(prompt), "seed": 7,
        "sampling_params": {"max_new_tokens": 24, "temperature": 0, "stop_token_ids": [stop]}})
    assert status == 200
    assert out["output_ids"] == expected[: expected.index(stop) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}

    assert _post(srv.url + "/generate", {"text": 5})[0] == 400
    assert _post(srv.url + "/generate", b"{not json")[0] == 400
    assert _post(srv.url + "/generate", {"input_ids": [1, 9999]})[0] == 400
    assert _get(srv.url + "/nope")[0] == 404

    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=TIMEOUT) == 0
    assert not srv.pid_file.exists()
    log = srv.log_file.read_text()
    assert "The server is fired up and ready to roll!" in log and "shutting down" in log
    assert "Traceback" not in log


def test_ddtree_without_overlay_fails_at_start_with_traceback(site_dir, tmp_path):
    unpatched = tmp_path / "unpatched"
    unpatched.mkdir()
    srv = start_server(site_dir, tmp_path, ["--speculative-algorithm", "DDTREE"],
                       {"DDTREE_RUNTIME_PATH": str(unpatched)})
    try:
        assert srv.port is None, "server became ready without a runtime"
        assert srv.proc.wait(timeout=TIMEOUT) != 0
        stderr = srv.proc.stderr.read()
        assert "Traceback" in stderr and "RuntimeLoadError" in stderr
        assert str(unpatched.resolve() / "__init__.py") in stderr
        assert "Traceback" in srv.log_file.read_text()
        assert not srv.pid_file.exists()
    finally:
        srv.stop()


def test_non_speculative_server_needs_no_runtime_and_answers_503_while_loading(site_dir, tmp_path):
    """NONE starts with no runtime anywhere; while 'loading' /health is 503; SIGTERM then exits 0."""
    srv = start_server(site_dir, tmp_path, ["--speculative-algorithm", "NONE", "--load-delay", "60"],
                       {"DDTREE_RUNTIME_PATH": str(tmp_path / "missing")}, wait_for=LISTENING_RE)
    try:
        assert srv.port is not None, srv.proc.stderr.read()
        assert _get(srv.url + "/health") == (503, b"")
        info = json.loads(_get(srv.url + "/get_server_info")[1])
        assert info["ready"] is False
        assert info["speculative_algorithm"] is None and info["ddtree_runtime_path"] is None
        assert _post(srv.url + "/generate", {"text": "hi"})[0] == 503
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=TIMEOUT) == 0
        assert "stopped while loading" in srv.log_file.read_text() and not srv.pid_file.exists()
    finally:
        srv.stop()
