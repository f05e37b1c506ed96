"""Programs we send to a host's Python interpreter: stdlib only, one round trip, JSON back (like Ansible modules).

Each module in this package defines ``OPS = {name: function}``; functions take keyword arguments and return
JSON-serialisable values, raising ``Failure`` (defined in ``_frame.py``) for an expected, explained failure.
``program_for(module)`` glues ``_frame.py`` (helpers and the reply protocol) in front of the module's source; the
transport pipes it into ``python -c`` on the host with the arguments appended, so nothing is installed there.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

RESULT_MARKER = "@@DDTREE-RESULT@@"
_HERE = Path(__file__).parent


@lru_cache(maxsize=None)
def program_for(module: str) -> bytes:
    """Source of the program that runs ``module``'s ops on a host."""
    path = _HERE / f"{module}.py"
    if not path.is_file() or module.startswith("_"):
        raise ValueError(f"no remote module named {module!r} in {_HERE}")
    frame = (_HERE / "_frame.py").read_text()
    body = path.read_text()
    return (frame + "\n\n# ---- " + module + " ----\n" + body + "\n\n_ddtree_main(OPS)\n").encode()
