"""The engine must stay a standalone package: stdlib + torch only, relative imports only."""

from __future__ import annotations

import ast
import sys

from refengine_helpers import PKG_DIR

ALLOWED_THIRD_PARTY = {"torch"}


def test_imports_are_stdlib_torch_or_relative():
    offenders = []
    for path in sorted(PKG_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY:
                    offenders.append(f"{path.name}:{node.lineno} imports {name}")
    assert offenders == [], offenders
    assert len(list(PKG_DIR.glob("*.py"))) >= 6  # the scan really covered the package's modules
