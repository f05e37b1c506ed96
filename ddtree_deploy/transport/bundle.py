"""What ``HostConnection.call`` and ``HostConnection.session`` send a host: the op's modules of
``ddtree_deploy.remote`` as one zip, and the boot line that runs them (the idea of Ansible's AnsiballZ: a module and
what it imports travel as a zip the host's own interpreter imports from, so nothing is installed there).

The wire: ``python -c BOOT`` reads two frames from fd 0, each preceded by its length (8 bytes, big-endian) and read
with ``os.read`` to the byte, no read-ahead: the zlib-compressed zip, then the JSON request ``{module, op, args}``.
Whatever follows them on stdin (a streamed payload, a session's command lines) is left for the op. The zip goes into
an anonymous memory file (``os.memfd_create``; where a host has none, a temporary file unlinked as it is made),
``zipimport`` imports the package from it through ``/proc/self/fd/N``, and ``_frame.main`` runs the op and writes
the reply line. Nothing lands on the host's disk under a name: nothing is left behind on any exit, a kill included,
and two ops never share a file. (zipimport compiles a module that has no bytecode twice, once for its file name
and once to run it, CPython gh-141276: about 10 ms of host CPU for a release op, a few ms for the others.)

The zip holds only the modules the op's module imports (its relative imports, followed; ``__init__`` and ``_frame``
always), as the package ``ddtree_remote``. Its bytes are deterministic (sorted names, fixed timestamps and modes,
stored, then compressed whole so the modules' shared text compresses once) and built once per content: cached by
the sha256 of the package's sources, which are read again for every request, so an edited module is what the next
call ships.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .. import remote

#: The package's name on the host (the zip's top folder): not the tool's own name, which the host may not have.
PACKAGE = "ddtree_remote"
#: Where the package's sources are.
SOURCE_DIR = Path(remote.__file__).parent
#: The modules every op runs with: the package itself and the reply protocol.
ALWAYS = ("__init__", "_frame")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold

#: The program the host's Python runs for every op (``python -c BOOT``; see the module docstring).
BOOT = (
    "import os,sys,zlib\n"
    "def _x(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: break\n"
    "  b+=c\n"
    " return b\n"
    "z=zlib.decompress(_x(int.from_bytes(_x(8),'big')))\n"
    "a=_x(int.from_bytes(_x(8),'big'))\n"
    "try:\n"
    " f=os.memfd_create('ddtree-remote')\n"
    "except (AttributeError,OSError):\n"
    " import tempfile\n"
    " t=tempfile.TemporaryFile()\n"
    " f=t.fileno()\n"
    "v=memoryview(z)\n"
    "while v: v=v[os.write(f,v):]\n"
    "sys.path.insert(0,'/proc/self/fd/%d'%f)\n"
    f"from {PACKAGE}._frame import main\n"
    "main(a)\n"
)


@dataclass(frozen=True)
class Sources:
    """The package's source files (module name -> bytes), known by their digest (equal digests: equal files)."""

    digest: str
    files: Mapping[str, bytes] = field(compare=False, repr=False)


def sources(directory: Path = SOURCE_DIR) -> Sources:
    """The ``*.py`` files of ``directory`` as they are now."""
    files = {p.stem: p.read_bytes() for p in sorted(directory.glob("*.py"))}
    h = hashlib.sha256()
    for name, data in files.items():
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return Sources(h.hexdigest(), files)


@lru_cache(maxsize=8)
def imports(src: Sources) -> dict[str, frozenset[str]]:
    """Each module's package imports: the modules its relative imports (anywhere in it) name. An import that
    reaches above the package is refused: the host has nothing there."""
    graph = {}
    for name, data in src.files.items():
        found = set()
        for node in ast.walk(ast.parse(data, f"{name}.py")):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            if node.level > 1:
                raise ValueError(f"remote/{name}.py line {node.lineno}: imports from outside the package, which a "
                                 "host does not have")
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        missing = sorted(found - set(src.files))
        if missing:
            raise ValueError(f"remote/{name}.py imports {', '.join(missing)}, which the package does not have")
        graph[name] = frozenset(found)
    return graph


def needs(module: str, src: Sources | None = None) -> list[str]:
    """The modules ``module``'s ops run with (it, what it imports, followed, and ``ALWAYS``), sorted."""
    src = src or sources()
    if module.startswith("_") or module not in src.files:
        public = sorted(n for n in src.files if not n.startswith("_"))
        raise ValueError(f"no remote module named {module!r} (have: {', '.join(public)})")
    graph = imports(src)
    seen: set[str] = set()
    todo = [module, *ALWAYS]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return sorted(seen)


def zip_bytes(names: list[str], src: Sources) -> bytes:
    """The modules ``names`` as the zip of package ``PACKAGE``: same files, same bytes (sorted, stored, fixed
    timestamps and modes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(names):
            info = zipfile.ZipInfo(f"{PACKAGE}/{name}.py", date_time=_EPOCH)
            info.create_system = 3  # unix, wherever the control side runs
            info.external_attr = 0o100644 << 16
            zf.writestr(info, src.files[name])
    return buf.getvalue()


@lru_cache(maxsize=64)
def _packed(module: str, src: Sources) -> bytes:
    return zlib.compress(zip_bytes(needs(module, src), src), 9)


def program(module: str) -> bytes:
    """The first frame for ``module``: its zip, compressed (built once per content of the package's sources)."""
    return _packed(module, sources())


def framed_request(module: str, op: str, args: dict[str, Any]) -> bytes:
    """What ``BOOT`` reads: the compressed zip for ``module`` and the ``{module, op, args}`` request, each preceded
    by its length (8 bytes, big-endian)."""
    zipped = program(module)
    request = json.dumps({"module": module, "op": op, "args": args}).encode()
    return len(zipped).to_bytes(8, "big") + zipped + len(request).to_bytes(8, "big") + request
