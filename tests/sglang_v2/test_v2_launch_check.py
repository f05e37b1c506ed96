"""Launch lines checked by the target release's own ServerArgs parser (ddtree_deploy.launch_check), on a
``connection: local`` host whose releases are the real 0.5.19 and 0.5.20 packages: 0.5.19 still takes
``--mamba-scheduler-strategy`` (an alias until then); 0.5.20 removed it, and the check names the flag and its new
spelling. A typo is named too; a command that does not start SGLang is not parsed."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from v2_helpers import base_deps, base_wheel, need_deps, stand_ins

from ddtree_deploy.errors import InputError
from ddtree_deploy.inventory import load_host_file
from ddtree_deploy.launch_check import check_launch_line, launch_argv
from ddtree_deploy.patchset.base import WheelBase
from ddtree_deploy.transport import HostConnection

import sys

BASE = ("{python} -m sglang.launch_server --model-path /models/q --port {port} --attention-backend triton "
        "--page-size 1 {ddtree_flags}")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A release root with releases/r19 and releases/r20: the real sglang packages of those wheels."""
    need_deps("0.5.19")
    r = tmp_path_factory.mktemp("releases-root")
    for v, rid in (("0.5.19", "r19"), ("0.5.20", "r20")):
        WheelBase(base_wheel(v)).materialize(r / "releases" / rid)
    return r


def host(tmp: Path, root: Path, command: str, flags: str = "--speculative-ddtree-budget 16"):
    pp = ":".join([*map(str, base_deps("0.5.19")), *stand_ins(tmp)])
    doc = {"name": "lc", "connection": "local", "python": sys.executable, "site_packages": str(tmp / "site"),
           "release_root": str(root), "server": {"kind": "managed", "command": command, "ddtree_flags": flags,
                                                  "port": 30000, "env": {"PYTHONPATH": pp}}}
    (tmp / "site").mkdir(exist_ok=True)
    path = tmp / "lc.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_host_file(path)


def test_argv_of_the_entry_points():
    assert launch_argv("/v/bin/python -m sglang.launch_server --port 1 --x") == ["--port", "1", "--x"]
    assert launch_argv("env A=1 /v/bin/sglang serve --model-path m") == ["--model-path", "m"]
    assert launch_argv("/v/bin/python -m ddtree_refengine --port 1") is None


def test_removed_flag_is_named_with_its_new_spelling(root: Path, tmp_path: Path):
    cmd = BASE + " --mamba-scheduler-strategy extra_buffer"
    h = host(tmp_path, root, cmd, flags="")  # the DDTree flags exist only in a patched release
    with HostConnection(h) as conn:
        assert check_launch_line(conn, h, "r19")["checked"], "0.5.19 still takes the old name"
        with pytest.raises(InputError) as err:
            check_launch_line(conn, h, "r20")
    msg = str(err.value)
    assert "field 'server.command'" in msg and "0.5.20" in msg and "nothing was switched" in msg
    assert "--mamba-scheduler-strategy (renamed --mamba-radix-cache-strategy in SGLang 0.5.20)" in msg
    assert "rename --mamba-scheduler-strategy -> --mamba-radix-cache-strategy" in msg


def test_new_spelling_and_typos(root: Path, tmp_path: Path):
    h = host(tmp_path, root, BASE + " --mamba-radix-cache-strategy extra_buffer --speculative-draft-window-size 64",
             flags="")
    with HostConnection(h) as conn:
        assert check_launch_line(conn, h, "r20") == {"checked": True, "version": "0.5.20", "args": 12}
        h2 = host(tmp_path, root, BASE + " --page-sise 1", flags="")
        with pytest.raises(InputError) as err:
            check_launch_line(conn, h2, "r20")
        assert "--page-sise" in str(err.value)
        h3 = host(tmp_path, root, BASE + " --speculative-dflash-draft-window-size 64", flags="")
        with pytest.raises(InputError) as err:
            check_launch_line(conn, h3, "r20")
        assert "--speculative-draft-window-size" in str(err.value)
        # the stock 0.5.20 package has no DDTree flags: the check reads the release, not a list of ours
        h4 = host(tmp_path, root, BASE)
        with pytest.raises(InputError) as err:
            check_launch_line(conn, h4, "r20")
        assert "--speculative-ddtree-budget" in str(err.value)
        h5 = host(tmp_path, root, "{python} -m ddtree_refengine --port {port}")
        assert check_launch_line(conn, h5, "r20")["checked"] is False
