"""Hooks through SGLang's plugin framework, on the real wheels: where SGLang loads its plugins, that the overlay's
hooks are in place once it did, and that a changed target is refused exactly, by `patchset check` and on the host."""
from __future__ import annotations

import ast
import importlib.util
import json
import zipfile
from pathlib import Path

import pytest
import yaml
from v2_helpers import BASES, REPO, base_wheel, run_python, script_result

from ddtree_deploy.errors import EXIT_PATCH
from ddtree_deploy.patchset.apply import SeriesDoesNotApply, apply_patchset
from ddtree_deploy.patchset.base import WheelBase
from ddtree_deploy.patchset.format import find_patchset_for
from ddtree_deploy.patchset.hooks import split_target


def _yaml_hooks(version: str) -> list[dict]:
    return yaml.safe_load((REPO / "patches" / "ddtree" / f"sglang-{version}" / "patchset.yaml").read_text())["hooks"]


def _calls(node: ast.AST) -> list[str]:
    """Names of the functions called in ``node``'s own statements, in source order."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            out.append((n.lineno, f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""))
    return [name for _, name in sorted(out)]


def test_sglang_loads_plugins_before_the_code_ddtree_hooks(v2_base: str):
    """Read from the base: the launcher loads the plugins before it parses the server arguments, the engine before
    it builds them, and a scheduler process first of all (before its workers, where the worker-side hooks run)."""
    with zipfile.ZipFile(base_wheel(v2_base)) as zf:
        def tree(path):
            return ast.parse(zf.read(path).decode())

        launch = tree("sglang/launch_server.py")
        main = next(n for n in launch.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
        calls = _calls(main)
        assert calls.index("load_plugins") < calls.index("prepare_server_args")
        sched = next(n for n in tree("sglang/srt/managers/scheduler.py").body
                     if isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process")
        body = [n for n in sched.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert ast.unparse(body[0]) == "load_plugins()", "a scheduler loads the plugins before anything else"
        engine = next(n for n in tree("sglang/srt/entrypoints/engine.py").body
                      if isinstance(n, ast.ClassDef) and n.name == "Engine")
        init = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        calls = _calls(init)
        assert calls.index("load_plugins") < calls.index("server_args_class")


def test_hooks_are_in_place_once_sglang_loaded_its_plugins(v2_base: str, v2_scripts: dict):
    got = script_result(v2_scripts, "plugin")
    assert got["entry_points"] == [{"name": "ddtree", "value": "sglang.srt.speculative.ddtree_v2.plugin:register",
                                    "dist": "ddtree_sglang_plugin"}], "found through the overlay's own dist-info"
    assert got["refused"] == {} and got["required"] == "ok"
    want = [(h["target"], h["type"]) for h in _yaml_hooks(v2_base)]
    assert [(h["target"], h["type"]) for h in got["hooks"]] == want
    for h in got["hooks"]:
        assert h["applied"] and h["wraps_base"] and h["calls_ours"], h


def test_without_the_plugin_ddtree_refuses_to_run(v2_trees, tmp_path: Path):
    """SGLang's loader logs a plugin's failure and carries on: DDTree itself refuses where its hooks are missing."""
    code = r'''
import json, os
from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.ddtree_v2 import plugin
os.environ["SGLANG_PLUGINS"] = "someone_else"
load_plugins()
try:
    plugin.require_applied("the DFLASH worker")
    print("RESULT" + json.dumps("ran"))
except RuntimeError as exc:
    print("RESULT" + json.dumps(str(exc)))
'''
    r = run_python(v2_trees("0.5.17"), tmp_path, code, plugins=False)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, r.stdout + r.stderr
    msg = json.loads(line[len("RESULT"):])
    assert "cannot run (the DFLASH worker" in msg and "ddtree plugin was not loaded" in msg and "SGLANG_PLUGINS" in msg


class _Edited(WheelBase):
    """The real wheel with one file's text edited (what a host's hotfix or the next release does to a target)."""

    def __init__(self, wheel: Path, path: str, old: str, new: str) -> None:
        super().__init__(wheel)
        self._path, self._old, self._new = path, old, new

    def read(self, path: str) -> bytes:
        data = super().read(path)
        if path == self._path:
            text = data.decode()
            assert self._old in text
            data = text.replace(self._old, self._new, 1).encode()
        return data


HOOK_FILE = "sglang/srt/arg_groups/speculative_hook.py"


def test_a_changed_hook_target_is_refused_like_a_hunk():
    ps = find_patchset_for("ddtree", "0.5.17", root=REPO / "patches")
    edited = _Edited(base_wheel("0.5.17"), HOOK_FILE, "def _handle_dflash(server_args: ServerArgs) -> None:\n",
                     "def _handle_dflash(server_args: ServerArgs) -> None:\n    pass\n")
    with pytest.raises(SeriesDoesNotApply) as err:
        apply_patchset(ps, edited)
    assert err.value.exit_code == EXIT_PATCH
    text = err.value.message
    assert "1 hook target(s)" in text and "sglang.srt.arg_groups.speculative_hook._handle_dflash" in text
    assert HOOK_FILE in text and "nothing was produced" in text
    [m] = err.value.details["hooks"]
    assert m["expected"] == next(h.sha256 for h in ps.hooks if h.target.endswith("._handle_dflash"))
    assert m["found"] != m["expected"] and len(m["found"]) == 64

    # a definition that moved away is a missing target, refused even under --allow-base-drift
    gone = _Edited(base_wheel("0.5.17"), HOOK_FILE, "def _handle_dflash(", "def _handle_dflash_moved(")
    with pytest.raises(SeriesDoesNotApply) as err:
        apply_patchset(ps, gone, allow_base_drift=True)
    assert "_handle_dflash is not defined in " + HOOK_FILE in err.value.message

    # under --allow-base-drift a changed target is a loud warning, and the overlay's table records what the base has
    res = apply_patchset(ps, edited, allow_base_drift=True)
    assert any("hook target(s)" in w for w in res.warnings)
    table = json.loads(next(f.content for f in res.overlay.files if f.path.endswith("plugin_hooks.json")))
    assert next(h["sha256"] for h in table["hooks"] if h["target"].endswith("._handle_dflash")) == m["found"]


def _plugin_module():
    spec = importlib.util.spec_from_file_location("ddtree_v2_plugin", REPO / "patches/ddtree/spec-v2/plugin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("version", BASES)
def test_the_plugin_checks_each_target_on_the_host_as_the_patch_set_does(version: str, tmp_path: Path):
    """The plugin's own reading of the host's files (it runs where ddtree_deploy is not installed) gives the hashes
    `patchset check` gives, on every base; an edited target is not hooked, named with both hashes."""
    plugin = _plugin_module()
    ps = find_patchset_for("ddtree", version, root=REPO / "patches")
    wheel = WheelBase(base_wheel(version))
    files = set()
    for h in ps.hooks:
        files.add(split_target(h.target, wheel.has)[0])
        if h.source:
            files.add(h.source.split("::")[0])
    for path in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(wheel.read(path))
    rows = [{"target": h.target, "type": h.type, "sha256": h.sha256, "source": h.source} for h in ps.hooks]
    assert [plugin._check(r, tmp_path) for r in rows] == [None] * len(rows)
    target = tmp_path / HOOK_FILE
    target.write_text(target.read_text().replace("def _handle_dflash(server_args", "def _handle_dflash(  server_args"))
    row = next(r for r in rows if r["target"].endswith("._handle_dflash"))
    why = plugin._check(row, tmp_path)
    assert why is not None and "changed since the overlay was built" in why and row["sha256"] in why
