"""Programs we send to a host's Python interpreter: stdlib only, one round trip, JSON back (like Ansible modules).

Each module in this package defines ``OPS = {name: function}``; functions take keyword arguments and return
JSON-serialisable values, raising ``Failure`` (defined in ``_frame.py``) for an expected, explained failure.
``program_for(module)`` glues ``_frame.py`` (helpers and the reply protocol) in front of the module's source; the
transport pipes it into ``python -c`` on the host with the arguments appended, so nothing is installed there.

A module that needs another module's functions on the host says so in a line ``# requires: server probe``: each
required module is then loaded into its own namespace (sharing the frame) and reachable as ``_MODULES["server"]``,
so modules keep their own names and never collide. A line ``# includes: _part`` glues ``_part.py`` into the
module's own namespace instead (one program split into files of one job each).
"""

from __future__ import annotations

import json
import re
import zlib
from functools import lru_cache
from pathlib import Path

RESULT_MARKER = "@@DDTREE-RESULT@@"
_HERE = Path(__file__).parent
_REQUIRES = re.compile(r"^# requires:(.*)$", re.MULTILINE)
_INCLUDES = re.compile(r"^# includes:(.*)$", re.MULTILINE)

_LOADER = '''
import types as _types
_MODULES = {}


def _load_module(name, source):
    ns = dict(globals())
    ns["__name__"] = "__ddtree_remote_" + name
    exec(compile(source, "<ddtree-remote:" + name + ">", "exec"), ns)
    _MODULES[name] = _types.SimpleNamespace(**{k: v for k, v in ns.items() if not k.startswith("__")})
'''


#: The line the host's Python runs for every program (``HostConnection.call``, its streamed form, and
#: ``HostConnection.session``): the compressed program and its JSON arguments arrive framed by their lengths, read
#: straight from fd 0 with no read-ahead, so what follows them on stdin (a streamed payload, a session's command
#: lines) is left for the op to read.
BOOT = (
    "import os,zlib\n"
    "def _x(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: break\n"
    "  b+=c\n"
    " return b\n"
    "p=zlib.decompress(_x(int.from_bytes(_x(8),'big')))\n"
    "a=_x(int.from_bytes(_x(8),'big'))\n"
    "exec(compile(p,'<ddtree-remote>','exec'),{'__name__':'__ddtree_remote__','_PAYLOAD':a})\n"
)


def framed_request(module: str, op: str, args: dict) -> bytes:
    """What ``BOOT`` reads first: the compressed program for ``module`` and the ``{op, args}`` request, each
    preceded by its length (8 bytes, big-endian)."""
    program = zlib.compress(program_for(module), 6)
    payload = json.dumps({"op": op, "args": args}).encode()
    return len(program).to_bytes(8, "big") + program + len(payload).to_bytes(8, "big") + payload


def _source(module: str, *, part: bool = False) -> str:
    path = _HERE / f"{module}.py"
    if not path.is_file() or module.startswith("_") != part:
        raise ValueError(f"no remote {'part' if part else 'module'} named {module!r} in {_HERE}")
    return path.read_text()


def requires(module: str) -> list[str]:
    """The remote modules ``module`` loads beside itself (its ``# requires:`` line), in load order."""
    m = _REQUIRES.search(_source(module))
    return m.group(1).split() if m else []


@lru_cache(maxsize=None)
def program_for(module: str) -> bytes:
    """Source of the program that runs ``module``'s ops on a host."""
    body = _source(module)
    frame = (_HERE / "_frame.py").read_text()
    parts = [frame]
    needed = requires(module)
    if needed:
        parts.append(_LOADER)
        for name in needed:
            parts.append(f"_load_module({name!r}, {_source(name)!r})\n")
    m = _INCLUDES.search(body)
    for name in m.group(1).split() if m else []:
        parts.append(f"\n\n# ---- {module}: {name} ----\n" + _source(name, part=True))
    parts.append("\n\n# ---- " + module + " ----\n" + body + "\n\n_ddtree_main(OPS)\n")
    return "".join(parts).encode()
