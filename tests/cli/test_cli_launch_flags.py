"""A restart whose launch line carries a flag the host's SGLang removed is refused before the switch (issue #32,
item 4), through the installed console script on a real sshd sandbox host running SGLang 0.5.20; ``hosts check`` and
``abi --live`` name it too, ``apply --fix-flags`` rewrites it (``--dry-run``: shows the edit), and a release pushed
for a line its SGLang refuses is removed again.

0.5.20 removed ``--mamba-scheduler-strategy`` (now ``--mamba-radix-cache-strategy``), which model cards still print.
The host's server command says the old name. A first ``apply`` restarts the server with DDTree off to record the
generation baseline before it pushes anything: that restart's line is parsed by the installed SGLang's own
``ServerArgs`` on the host first (as the switch's is by the release's), so the deploy stops there, naming the flag and
its new spelling, with nothing switched, no server started and no release left pending. (Before this test the
baseline restart started the server with the removed flag and reported only that it died.)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from hostcopy import free_port

from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.release import ReleaseManager
from ddtree_deploy.sandbox import Sandbox
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang_v2"))
from v2_helpers import base_deps, need_deps, stand_ins  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow, pytest.mark.wheels]
NAME = "s20"
COMMAND = ("{python} -m sglang.launch_server --model-path /models/q36 --port {port} --attention-backend triton "
           "--page-size 1 --mamba-scheduler-strategy extra_buffer {ddtree_flags}")


@pytest.fixture(scope="module")
def box(sandbox, wheel_env, tmp_path_factory):
    """A sandbox host of its own with SGLang 0.5.20 installed (no deps), its server command the model card's."""
    need_deps("0.5.20")
    root = tmp_path_factory.mktemp("launch-flags")
    inv = root / "hosts"
    s20 = Sandbox(root / "state", root / "made")
    state = s20.up(((NAME, "0.5.20"),))
    doc = yaml.safe_load(Path(state.hosts[NAME].inventory_file).read_text())
    doc["server"].update(command=COMMAND, port=free_port(), ddtree_flags="--speculative-algorithm DFLASH "
                         "--speculative-draft-model-path /models/q36-dflash --speculative-ddtree-budget 16",
                         env={"PYTHONPATH": ":".join([*map(str, base_deps("0.5.20")), *stand_ins(root / "si")])})
    inv.mkdir()
    host_file = inv / f"{NAME}.yaml"
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(root / "snapshots")}

    def run(*args: str, timeout: float = 900):
        return wheel_env.run(*args, timeout=timeout, **env)

    yield run, host_file
    s20.down()


def _state(host_file: Path) -> tuple[dict, dict]:
    host = load_host_file(host_file)
    with HostConnection(host) as conn:
        return ReleaseManager(conn).show(), ServerControl(conn).status()


def test_hosts_check_names_the_removed_flag(box) -> None:
    run, host_file = box
    p = run("hosts", "check", NAME, "--json")
    assert p.returncode == 2, (p.stdout + p.stderr)[-3000:]
    (row,) = json.loads(p.stdout)
    assert not row["ok"] and row["sglang"] == "0.5.20", row
    assert "--mamba-scheduler-strategy (renamed --mamba-radix-cache-strategy in SGLang 0.5.20)" in row["error"], row
    assert row["error"].startswith(f"{host_file}: field 'server.command'"), row


def test_abi_live_reports_the_launch_line_as_an_error(box) -> None:
    run, host_file = box
    p = run("abi", NAME, "--live", "--json")
    assert p.returncode == 4, (p.stdout + p.stderr)[-3000:]
    doc = json.loads(p.stdout)
    (f,) = [f for f in doc["findings"] if f["rule"] == "launch_line"]
    assert f["severity"] == "error" and f["host"] == NAME, f
    assert "--mamba-scheduler-strategy (renamed --mamba-radix-cache-strategy in SGLang 0.5.20)" in f["what"], f
    assert "--fix-flags" in f["fix"], f


def test_removed_flag_stops_the_deploy_before_the_switch(box) -> None:
    run, host_file = box
    before, _ = _state(host_file)
    p = run("apply", "--host", NAME, "--ignore-abi")
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 2, out[-3000:]
    assert "--mamba-scheduler-strategy" in out and "--mamba-radix-cache-strategy" in out, out[-3000:]
    assert "0.5.20" in out and "server.command" in out and "nothing was switched" in out, out[-3000:]
    assert "nothing was restarted" in out and "cannot record a baseline" not in out, out[-3000:]
    after, server = _state(host_file)
    assert after.get("current") == before.get("current") and not after.get("pending"), after
    assert not server.get("running"), server


def test_fix_flags_dry_run_shows_the_edit_and_writes_nothing(box) -> None:
    run, host_file = box
    text = host_file.read_text()
    p = run("apply", "--host", NAME, "--fix-flags", "--dry-run", "--ignore-abi")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert f"--fix-flags would edit {host_file}" in " ".join(out.split()), out[-3000:]
    assert "-  command:" in out or "--mamba-scheduler-strategy" in out, out[-3000:]
    assert "+" in out and "--mamba-radix-cache-strategy" in out, out[-3000:]
    assert host_file.read_text() == text  # nothing written


def test_fix_flags_writes_the_new_spelling_and_the_check_passes(box) -> None:
    run, host_file = box
    before, _ = _state(host_file)
    p = run("apply", "--host", NAME, "--fix-flags", "--ignore-abi")
    out = " ".join((p.stdout + p.stderr).split())
    doc = yaml.safe_load(host_file.read_text())
    assert "--mamba-radix-cache-strategy extra_buffer" in doc["server"]["command"], doc["server"]["command"]
    assert "--mamba-scheduler-strategy" not in doc["server"]["command"]
    assert "renamed --mamba-scheduler-strategy -> --mamba-radix-cache-strategy (SGLang 0.5.20)" in out, out[-3000:]
    # the launch line now passes the check: what stops this run is the server itself (no GPU, no CUDA torch here)
    assert "does not know" not in out, out[-3000:]
    assert p.returncode != 0, out[-3000:]
    after, server = _state(host_file)
    assert after.get("current") == before.get("current") and not after.get("pending"), after
    assert [r["id"] for r in after["state"]["releases"]] == [r["id"] for r in before["state"]["releases"]]


def test_a_release_whose_launch_line_is_refused_is_removed_again(box) -> None:
    run, host_file = box
    doc = yaml.safe_load(host_file.read_text())
    doc["server"]["ddtree_flags"] = doc["server"]["ddtree_flags"].replace("--speculative-ddtree-budget",
                                                                          "--speculative-ddtree-budgett")
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    before, _ = _state(host_file)
    p = run("apply", "--host", NAME, "--no-baseline", "--ignore-abi")
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 2, out[-3000:]
    assert "--speculative-ddtree-budgett" in out and "was removed from the host" in out, out[-3000:]
    after, server = _state(host_file)
    assert [r["id"] for r in after["state"]["releases"]] == [r["id"] for r in before["state"]["releases"]], after
    assert after.get("current") == before.get("current") and not after.get("pending"), after
    assert not server.get("running"), server
    with HostConnection(load_host_file(host_file)) as conn:  # the host journal names the removal
        lines = ReleaseManager(conn).show(journal_lines=20)["journal"]
    assert any(ln.get("event") == "discard" and "launch line refused" in ln.get("why", "") for ln in lines), lines
