"""The runtime as the overlay ships it: importable by path under any name, exports, self-test."""
from __future__ import annotations

import ast
import importlib.util
import sys

import pytest
import torch
from rt_env import RUNTIME_DIR, load_runtime

EXPORTS = {"draft_topk", "build_tree", "DraftTree", "build_verify_inputs", "VerifyInputs", "sample_target_tokens",
           "accept_walk", "WalkResult", "kv_compaction", "self_test", "__version__"}


def test_exports(rt):
    assert EXPORTS <= set(dir(rt))
    assert isinstance(rt.__version__, str) and rt.__version__.count(".") == 2


def test_relocatable_imports_only():
    """Only relative imports of its own modules, plus torch / triton / stdlib (vendored as sglang/.../ddtree)."""
    allowed = {"torch", "triton", "__future__", "dataclasses", "functools", "heapq", "json", "math", "os", "re",
               "statistics", "time", "typing"}
    for path in RUNTIME_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, path.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in allowed, f"{path.name}: {node.module}"


def test_loads_under_another_name():
    mod = load_runtime("vendored_ddtree_copy")
    try:
        tree = mod.build_tree(torch.zeros(1, 2, 3), torch.arange(6).view(1, 2, 3), torch.tensor([5]), 2, impl="torch")
        assert tree.num_nodes.tolist() == [3]
        assert type(tree).__module__ == "vendored_ddtree_copy.types"
    finally:
        for name in [n for n in sys.modules if n.startswith("vendored_ddtree_copy")]:
            del sys.modules[name]


def test_self_test_cpu(rt):
    report = rt.self_test("cpu")
    assert report["ok"], report
    assert set(report["checks"]) == {"draft_topk", "build_tree", "build_verify_inputs", "sample_walk_compaction"}
    assert report["impl"] == "torch" and report["version"] == rt.__version__


def test_impl_argument_is_checked(rt):
    with pytest.raises(ValueError):
        rt.draft_topk(torch.zeros(1, 1, 4), 2, impl="cuda")
    assert importlib.util.find_spec("ddtree_runtime.tree_ref") is not None
