"""`ddtree-deploy apply` end to end on a sandbox host, through the real command line: the real DDTree patch set
applied to the host's own snapshot, the ABI verdict, the overlay pushed as a release, and the reference engine
(real DDTree decoding on CPU with the overlay's runtime) restarted on it and probed against a DDTree-off baseline."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_inproc import run_cli

from ddtree_deploy.deploy import plan
from ddtree_deploy.runtime_files import metrics_module
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.server import ServerControl, base_url
from ddtree_deploy.snapshot import SnapshotStore
from ddtree_deploy.transport import HostConnection
from standin.helpers import remove_root, write_host_yaml

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def e2e(sandbox, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apply")
    host = dataclasses.replace(sandbox.base, release_root="/srv/ddtree-host/t-apply",
                               probe=dict(sandbox.base.probe, startup_timeout=60.0))
    write_host_yaml(host, tmp / "hosts")
    env = {**os.environ, "DDTREE_INVENTORY": str(tmp / "hosts"), "DDTREE_SNAPSHOTS": str(tmp / "snapshots")}
    yield host, env
    remove_root(host)


def _cli(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ddtree_deploy", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _state(host):
    with HostConnection(host) as conn:
        mgr = ReleaseManager(conn)
        return mgr.show(), mgr.installed_manifest()


def test_dry_run_shows_a_summary_first_the_diff_on_request_and_touches_nothing(e2e):
    host, env = e2e
    first = _cli(env, "apply", "--host", host.name, "--dry-run")  # the store has no snapshot yet: none is taken
    assert first.returncode == 0, first.stderr
    assert "[snapshot] take a snapshot" in first.stdout and not Path(env["DDTREE_SNAPSHOTS"]).exists()
    assert _cli(env, "snapshot", "take", host.name).returncode == 0
    proc = _cli(env, "apply", "--host", host.name, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "the overlay against the installed package" in text and "sglang/srt/server_args.py +" in text
    assert " files, +" in text and "changed=1: no overlay is active" in text and "[snapshot]" not in text
    assert "record a generation baseline first" in text and "build a new release with" in text
    assert "restart `" in text and "probe it; on failure roll back to the installed package" in text
    assert "(the full diff: --diff)" in text and "@@ " not in proc.stdout  # the summary, not 3,000 lines of diff
    assert "ABI findings" in proc.stdout and "nothing was touched" in proc.stdout
    full = _cli(env, "apply", "--host", host.name, "--dry-run", "--diff")
    assert full.returncode == 0 and "+++ b/sglang/srt/server_args.py" in full.stdout and "@@ " in full.stdout
    assert _cli(env, "apply", "--host", host.name, "--diff").returncode == 2  # --diff goes with --dry-run
    _untouched(host)


def _untouched(host):
    """No release, no switch, no lock (the snapshot may keep its hash cache in the release root)."""
    info, _ = _state(host)
    assert info["current"] is None and info["state"]["releases"] == [] and info["lock"] is None


def test_abi_errors_refuse_with_exit_4_unless_ignored_then_real_engine_passes(e2e, monkeypatch):
    host, env = e2e
    monkeypatch.setenv("DDTREE_SNAPSHOTS", env["DDTREE_SNAPSHOTS"])
    monkeypatch.chdir(REPO)
    p = plan(host)
    _, manifest = _state(host)
    if p.abi_errors:  # the sandbox's CPU torch is outside the patch set's torch range: refused, nothing touched
        proc = _cli(env, "apply", "--host", host.name)
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "ABI check failed; nothing was pushed" in proc.stderr
        _untouched(host)
    proc = _cli(env, "apply", "--host", host.name, "--ignore-abi", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["status"] == "ok" and report["details"]["patchset"] == p.overlay.patchset
    stages = {s["name"]: s for s in report["probe"]["stages"]}
    runtime_version = (REPO / "patches/ddtree/runtime/_version.py").read_text().split('__version__ = "', 1)[1].split('"')[0]
    assert stages["overlay"]["data"]["runtime_version"] == runtime_version
    assert stages["startup"]["data"]["server_runtime_path"].startswith(f"{host.release_root}/releases/{report['release']}/sglang/")
    gen = stages["generation"]
    assert gen["status"] == "pass"  # DDTree on matches the DDTree-off greedy baseline token for token
    assert gen["data"]["spec_accept_length"] >= 1.0
    # what the user sees of DDTree: the budget, accept length and tok/s, from the probe and from the server itself
    dd = report["probe"]["ddtree"]
    assert dd["algorithm"] == "DDTREE" and dd["budget"] == 16 and dd["draft_tokens"] == 8
    assert dd["accept_length"] == gen["data"]["spec_accept_length"] and dd["server_accept_length"] >= 1.0
    # the printed speed is the probe's own (its requests' output tokens over their wall time), not SGLang's last
    # log-interval figure (which read 0.0, then 5-8 tok/s on the H200 while requests ran at 415-512)
    per = gen["data"]["per_prompt"]
    client = sum(r["tokens"] for r in per) / sum(r["seconds"] for r in per)
    assert dd["tok_s"] == pytest.approx(client, abs=0.06) and dd["tok_s"] > 0
    assert dd["server_last_gen_throughput"] >= 0 and "server_tok_s" not in dd
    assert report["details"]["ddtree"].startswith("DDTREE budget 16 · accept length ")
    assert report["details"]["ddtree"].endswith(f"· {dd['tok_s']} tok/s (probe's requests)")
    info, after = _state(host)
    assert info["state"]["active"] == report["release"] and after == manifest
    proc = _cli(env, "releases", host.name, "--json")
    rel = json.loads(proc.stdout)
    assert rel["state"]["releases"][-1]["status"] == "good" and rel["state"]["releases"][-1]["patchset"] == p.overlay.patchset


def test_reapply_is_unchanged_and_force_redoes_it(e2e):
    """Issue #16.5: the same overlay active and passing its probe: "unchanged", no new release, no restart."""
    host, env = e2e
    info, _ = _state(host)
    releases = [r["id"] for r in info["state"]["releases"]]
    with HostConnection(host) as conn:
        pid = ServerControl(conn).status()["pid"]
    proc = _cli(env, "apply", "--host", host.name)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "unchanged" in text and "already holds this overlay and passes its probe" in text
    assert text.count("DDTREE budget 16 · accept length") == 1  # and what DDTree does there, said once
    info, _ = _state(host)
    assert [r["id"] for r in info["state"]["releases"]] == releases
    with HostConnection(host) as conn:
        assert ServerControl(conn).status()["pid"] == pid  # not restarted
    forced = _cli(env, "apply", "--host", host.name, "--force", "--json")
    assert forced.returncode == 0, forced.stderr[-2000:]
    doc = json.loads(forced.stdout)
    assert doc["status"] == "ok" and doc["release"] not in releases
    with HostConnection(host) as conn:
        assert ServerControl(conn).status()["pid"] != pid


# the host's own traffic during the live windows: greedy requests in a loop on the host until the stop file appears
_TRAFFIC = r'''
import json, os, sys, time, urllib.request
url, stop, until = sys.argv[1], sys.argv[2], time.time() + 60
body = json.dumps({"text": "Once upon a time", "sampling_params": {"temperature": 0.0, "max_new_tokens": 24}}).encode()
while time.time() < until and not os.path.exists(stop):
    urllib.request.urlopen(urllib.request.Request(url + "/generate", data=body), timeout=30).read()
'''


def _traffic(host, stop):
    with HostConnection(host) as conn:
        conn.run(f"{shlex.quote(host.python)} -c {shlex.quote(_TRAFFIC)} {base_url(host)} {stop}", timeout=90,
                 check=False)


def _counters(conn, host):
    """The server's DDTree counters now (drafts, accepted draft tokens), read on the host as the live columns are."""
    m = metrics_module()
    acc = m.acceptance(conn.call("probe", "metrics", url=base_url(host), prefix=m.PREFIX, timeout=30) or "")
    return (int(acc["drafts"]), int(acc["accepted_tokens"])) if acc else (0, 0)


def _live_row(stdout):
    """The live table's row as printed: [accept length, decode tok/s, over]."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "live (the server's DDTree counters" in line)
    row = next(line.strip() for line in lines[at + 1:] if line.lstrip().startswith("│"))
    return [c.strip() for c in row.strip("│").split("│")]


def test_probe_shows_ddtree_budget_accept_length_and_tok_s(e2e):
    host, env = e2e
    proc = _cli({**env, "COLUMNS": "200"}, "probe", host.name, "--live-window", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())
    assert "DDTree: DDTREE budget 16 · accept length" in text and "(server avg" in text
    assert "tok/s (probe's requests)" in text and "tok/s (server" not in text
    assert text.count("DDTree: DDTREE budget 16") == 1  # one line, not two
    # issue #30.6: and live, from the server's counters after the probe: nothing decoded in the window, so "idle"
    # (no speed made up) and the accept length since start, exactly the counters' 1 + accepted / drafts
    with HostConnection(host) as conn:
        drafts, accepted = _counters(conn, host)
    accept, speed, over = _live_row(proc.stdout)
    assert speed == "idle" and accept == f"{round(1 + accepted / drafts, 3)} (since start)" and "nothing decoded" in over


def test_drift_after_the_snapshot_is_refused_and_allow_base_drift_is_loud(e2e, sandbox):
    """Issue #17.3: a hotfix to an installed file the overlay replaces, made after the snapshot apply reuses, is
    not silently dropped: the host's build refuses; --allow-base-drift pushes anyway and says so everywhere."""
    host, env = e2e
    site = sandbox.box.load_state().hosts[sandbox.base.name].fs / Path(host.site_packages).relative_to("/srv/ddtree-host")
    target = site / "sglang" / "srt" / "server_args.py"
    original, stat_before = target.read_bytes(), target.stat()
    info, _ = _state(host)
    active = info["state"]["active"]
    try:
        target.write_bytes(original + b"\n# hotfix applied on the host after the snapshot\n")
        proc = _cli(env, "apply", "--host", host.name, "--force")
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        err = " ".join(proc.stderr.split())
        assert "the installed sglang changed since snapshot" in err and "sglang/srt/server_args.py: sha256" in err
        assert "nothing was switched" in err and "--allow-base-drift" in err
        assert _state(host)[0]["state"]["active"] == active
        loud = _cli(env, "apply", "--host", host.name, "--force", "--allow-base-drift", "--json")
        assert loud.returncode == 0, loud.stdout[-2000:] + loud.stderr[-2000:]
        doc = json.loads(loud.stdout)
        assert any("server_args.py" in d for d in doc["details"]["base_drift"])
        assert "WARNING: pushed despite base drift" in loud.stderr
        with HostConnection(host) as conn:
            record = json.loads(conn.run(f"cat {host.release_root}/releases/{doc['release']}/RELEASE.json").text())
        assert record["allow_base_drift"] is True and any("server_args.py" in d for d in record["base_drift"])
        # an upgrade after the snapshot (here: the dist-info says 0.5.23) is named as such
        meta = next(site.glob("sglang-0.5.11.dist-info")) / "METADATA"
        text, meta_stat = meta.read_text(), meta.stat()
        meta.write_text(text.replace("Version: 0.5.11", "Version: 0.5.23", 1))
        try:
            up = _cli(env, "apply", "--host", host.name, "--force")
            assert up.returncode == 1 and "sglang 0.5.23 is installed, the overlay was built for 0.5.11" in " ".join(up.stderr.split())
        finally:
            meta.write_text(text)
            os.utime(meta, ns=(meta_stat.st_atime_ns, meta_stat.st_mtime_ns))
    finally:
        target.write_bytes(original)
        os.utime(target, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
    back = _cli(env, "rollback", host.name, "--to", active)
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]


def test_fleet_rerun_is_unchanged_everywhere(e2e, sandbox):
    """Issue #16.5 for a fleet: hosts already on the overlay are left alone; a second run changes nothing anywhere."""
    from ddtree_deploy.sandbox import _free_port

    host, env = e2e
    other = dataclasses.replace(sandbox.base, name="apply-second", release_root="/srv/ddtree-host/t-apply-second",
                                server=dict(sandbox.base.server, port=_free_port(exclude={host.server["port"]})),
                                probe=dict(host.probe))
    write_host_yaml(other, Path(env["DDTREE_INVENTORY"]))
    # the same machine: start from its snapshot (no second torch import)
    store = SnapshotStore(Path(env["DDTREE_SNAPSHOTS"]))
    latest = store.latest(host.name)
    shutil.copytree(latest.path, store.entry_dir(other.name, latest.id))
    try:
        first = _cli(env, "apply", "--host", host.name, "--host", other.name, "--no-baseline", "--json")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert [h["status"] for h in json.loads(first.stdout)["hosts"]] == ["unchanged", "ok"]
        releases = [r["id"] for r in _state(other)[0]["state"]["releases"]]
        again = _cli(env, "apply", "--host", host.name, "--host", other.name, "--no-baseline", "--json")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert [h["status"] for h in json.loads(again.stdout)["hosts"]] == ["unchanged", "unchanged"]
        assert [r["id"] for r in _state(other)[0]["state"]["releases"]] == releases
    finally:
        remove_root(other)
        (Path(env["DDTREE_INVENTORY"]) / f"{other.name}.yaml").unlink()


def test_cli_fleet_recap_and_retry_file(e2e, tmp_path, sandbox):
    """Canary (the base host) deploys; the 0.5.11 patch set does not apply to the drifted host's sglang 0.5.23:
    refused with exit 5, listed in the recap and written to the retry file; --retry-failed picks exactly it up."""
    host, env = e2e
    drift = dataclasses.replace(sandbox.drift, release_root="/srv/ddtree-host/t-apply-drift")
    write_host_yaml(drift, Path(env["DDTREE_INVENTORY"]))
    retry = tmp_path / "retry"
    try:
        pin = ["--patchset", "ddtree/sglang-0.5.11", "--ignore-abi", "--retry-file", str(retry)]
        proc = _cli(env, "apply", "--host", host.name, "--host", drift.name, *pin)
        assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "recap" in proc.stdout and "refused" in proc.stdout
        assert retry.read_text().split() == [drift.name]
        proc = _cli(env, "apply", "--retry-failed", *pin, "--json")
        doc = json.loads(proc.stdout)
        assert proc.returncode == 5 and [h["host"] for h in doc["hosts"]] == [drift.name]
        assert doc["hosts"][0]["status"] == "refused" and "0.5.23" in doc["hosts"][0]["message"]
        assert _state(drift)[0]["state"]["releases"] == []
    finally:
        remove_root(drift)


def test_releases_shows_the_servers_live_accept_length_and_tok_s(e2e):
    """Issue #30.6: the live columns agree with the server's own counters: while the host serves traffic, releases
    prints 1 + accepted / drafts and the tokens per second of its window, whose counts lie within what the counters
    grew by around the command (and --json the same figures under their definitions' names); with the server down
    it shows "-" and the reason, and still succeeds (the idle case: test_probe_shows_ddtree_budget_...)."""
    host, env = e2e
    stop = f"{host.release_root}/stop-live-traffic"
    traffic = threading.Thread(target=_traffic, args=(host, stop))
    with HostConnection(host) as conn:
        c0 = _counters(conn, host)
        traffic.start()
        try:
            deadline = time.time() + 20
            while _counters(conn, host) == c0 and time.time() < deadline:  # the traffic has reached the server
                time.sleep(0.1)
            c1 = _counters(conn, host)
            text = run_cli("releases", host.name, "--live-window", "1", env=env, columns=200)
            doc = json.loads(run_cli("releases", host.name, "--live-window", "0.5", "--json", env=env).stdout)["live"]
            c2 = _counters(conn, host)
        finally:
            conn.run(f"touch {stop}")
            traffic.join(60)
        ServerControl(conn).stop()
    assert text.returncode == 0, text.stdout + text.stderr
    accept, speed, over = _live_row(text.stdout)
    tokens, drafts = (int(x) for x in re.search(r"(\d+) tokens in (\d+) drafts", over).groups())
    seconds = float(re.search(r"last ([\d.]+) s", over).group(1))
    assert 0 < drafts <= c2[0] - c1[0] and tokens - drafts <= c2[1] - c1[1]
    assert float(accept) == pytest.approx(1 + (tokens - drafts) / drafts, abs=1e-3)
    assert float(speed) == pytest.approx(tokens / seconds, rel=1e-3, abs=0.1) and float(speed) > 0
    assert doc["status"] == "decoding" and 0.4 <= doc["window_s"] < 1.5
    w = doc["window"]
    assert 0 < w["drafts"] <= c2[0] - c1[0] and w["tokens"] == w["drafts"] + w["accepted_tokens"]
    assert doc["mean_acceptance_length"] == round(1 + w["accepted_tokens"] / w["drafts"], 3)
    assert doc["decode_tokens_per_s"] == round(w["tokens"] / doc["window_s"], 1)
    assert set(doc["definitions"]) >= {"mean_acceptance_length", "decode_tokens_per_s"}

    down = run_cli("releases", host.name, env=env, columns=200)
    assert down.returncode == 0, down.stdout + down.stderr
    row = _live_row(down.stdout)
    assert row[:2] == ["-", "-"] and "GET /metrics failed" in row[2] and "refused" in row[2]
    doc = json.loads(run_cli("releases", host.name, "--json", env=env).stdout)["live"]
    assert doc["status"] == "unavailable" and doc["decode_tokens_per_s"] is None and "refused" in doc["reason"]
