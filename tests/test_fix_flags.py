"""``apply --fix-flags``: the new spelling of flags SGLang removed, written into the host file (launch_check.renamed_in,
plan_flag_fix; hostfile.plan_server_edit). Only flag words change, only for a version that removed them, and the
rest of the file (comments, quoting, folding, other fields) stays byte for byte."""
from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.errors import InputError
from ddtree_deploy.hostfile import plan_budget_edit
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.launch_check import plan_flag_fix, renamed_in

HOST = """\
# a GPU host of the eval fleet
address: gpu1.example.org
python: /opt/venv/bin/python
site_packages: /opt/venv/lib/python3.12/site-packages
release_root: /srv/ddtree   # releases live here
server:
  kind: managed
  port: 30000
  command: >-
    {python} -m sglang.launch_server --model-path /models/Qwen3.6-27B
    --mamba-scheduler-strategy extra_buffer --port {port} {ddtree_flags}
  ddtree_flags: "--speculative-algorithm DFLASH --speculative-dflash-draft-window-size=64 --speculative-ddtree-budget 16"
"""


def _changed(diff: str) -> tuple[int, int]:
    lines = diff.splitlines()
    return (sum(ln.startswith("-") and not ln.startswith("---") for ln in lines),
            sum(ln.startswith("+") and not ln.startswith("+++") for ln in lines))


def _host(tmp_path: Path, text: str = HOST):
    path = tmp_path / "gpu1.yaml"
    path.write_text(text)
    return load_host_file(path)


def test_only_flag_words_of_a_version_that_removed_them():
    line = ("--mamba-scheduler-strategy a --mamba-scheduler-strategy=b '--speculative-dflash-draft-window-size' 8 "
            "--x-mamba-scheduler-strategy c --mamba-scheduler-strategy-extra d /models/--mamba-scheduler-strategy")
    fixed, done = renamed_in(line, "0.5.20")
    assert fixed == ("--mamba-radix-cache-strategy a --mamba-radix-cache-strategy=b '--speculative-draft-window-size' 8 "
                     "--x-mamba-scheduler-strategy c --mamba-scheduler-strategy-extra d "
                     "/models/--mamba-scheduler-strategy")
    assert done == ["--mamba-scheduler-strategy -> --mamba-radix-cache-strategy",
                    "--speculative-dflash-draft-window-size -> --speculative-draft-window-size"]
    assert renamed_in(line, "0.5.23")[0] == fixed
    for older in ("0.5.19", "0.5.17", "0.5.11", None, "not-a-version"):
        assert renamed_in(line, older) == (line, []), older


def test_the_edit_changes_the_flags_and_nothing_else(tmp_path: Path):
    host = _host(tmp_path)
    fix = plan_flag_fix(host, "0.5.21")
    assert fix is not None and fix.file == host.source
    assert fix.renames == ["--mamba-scheduler-strategy -> --mamba-radix-cache-strategy",
                           "--speculative-dflash-draft-window-size -> --speculative-draft-window-size"]
    assert fix.new_text == HOST.replace("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy").replace(
        "--speculative-dflash-draft-window-size", "--speculative-draft-window-size")
    assert _changed(fix.diff) == (2, 2), fix.diff
    assert fix.host.server["command"].split()[5] == "--mamba-radix-cache-strategy"
    assert "--speculative-draft-window-size=64" in fix.host.server["ddtree_flags"]
    assert Path(host.source).read_text() == HOST  # planning writes nothing
    assert plan_flag_fix(host, "0.5.19") is None


def test_a_budget_edit_still_goes_through_the_same_editor(tmp_path: Path):
    host = _host(tmp_path)
    old, new, diff = plan_budget_edit(host, "1:64,8:16")
    assert old == HOST and new == HOST.replace("--speculative-ddtree-budget 16", "--speculative-ddtree-budget 1:64,8:16")
    assert _changed(diff) == (1, 1), diff


def test_a_file_without_a_server_mapping_is_refused_naming_it(tmp_path: Path):
    host = _host(tmp_path)
    Path(host.source).write_text(HOST.split("server:")[0] + "server: [1]\n")
    with pytest.raises(InputError) as err:
        plan_flag_fix(host, "0.5.20")
    assert str(err.value).startswith(f"{host.source}: field 'server'")
