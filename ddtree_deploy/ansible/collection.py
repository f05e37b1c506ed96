"""The ``ddtree.deploy`` collection, built from this package: its source tree plus the host programs.

The modules run on a host's Python with the standard library and their module_utils only, so what the CLI sends a
host for each op (``ddtree_deploy.remote``'s modules, zipped by ``transport.bundle``) travels inside the collection
as ``plugins/module_utils/_programs.py``, written here when the collection is laid out; the repository holds no copy
of it. ``host_programs`` is the one place that asks ``transport.bundle`` what to ship (the boot line, the reply
marker, each shipped module's zip), and ``_host.py``'s ``_framed`` / ``call`` the one place on the host that runs
them: a change of how the remote modules are packed touches those two.

``layout(dest)`` writes an installed-form collection (``dest/ansible_collections/ddtree/deploy``), usable at once
through ``ANSIBLE_COLLECTIONS_PATH=dest``; ``build(out)`` makes the ``ansible-galaxy collection build`` artifact;
``ensure(cache)`` is what ``apply --engine ansible`` runs the collection from (laid out once per content).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from pathlib import Path

import yaml

from .. import __version__, paths
from ..errors import InputError

NAMESPACE, NAME = "ddtree", "deploy"
#: The remote modules whose ops the collection's modules run (each with what it imports: transport.bundle.needs).
SHIPPED = ("release", "probe", "server", "facts", "manifest", "hostinfo")
GENERATED = Path("plugins") / "module_utils" / "_programs.py"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "_programs.py", "*.tar.gz", ".pytest_cache")


def source_dir() -> Path:
    """The collection's source: the checkout's ``ansible_collections/ddtree/deploy``, else the wheel's copy."""
    root = paths.checkout_root()
    if root is not None and (root / "ansible_collections" / NAMESPACE / NAME / "galaxy.yml").is_file():
        return root / "ansible_collections" / NAMESPACE / NAME
    shipped = Path(__file__).resolve().parent.parent / "_collection"
    if (shipped / "galaxy.yml").is_file():
        return shipped
    raise InputError("the ddtree.deploy collection is not in this installation (no ansible_collections/ddtree/deploy "
                     f"in a checkout, no {shipped})", hint="reinstall ddtree-deploy")


def host_programs() -> dict[str, object]:
    """What the collection ships of ``ddtree_deploy.remote``: the boot line, the reply marker, and for each module of
    ``SHIPPED`` the compressed zip the boot line reads (``transport.bundle.program``: the bytes the CLI sends)."""
    from ..remote import RESULT_MARKER
    from ..transport import bundle

    return {"boot": bundle.BOOT, "marker": RESULT_MARKER, "programs": {m: bundle.program(m) for m in SHIPPED}}


def render_programs(shipped: dict[str, object]) -> str:
    lines = ["# -*- coding: utf-8 -*-",
             "# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)",
             f"# Written by ddtree-deploy {__version__} (ddtree_deploy.ansible.collection) from ddtree_deploy.remote when",
             "# the collection is built: what the CLI sends a host for each op (the zip of the remote modules it",
             "# needs, compressed), packed for the modules. Do not edit.",
             "from __future__ import absolute_import, division, print_function", "", "__metaclass__ = type", "",
             f"BOOT = {shipped['boot']!r}", f"MARKER = {shipped['marker']!r}", "PROGRAMS = {"]
    for name, blob in shipped["programs"].items():  # type: ignore[union-attr]
        text = base64.b64encode(blob).decode()
        lines.append(f"    {name!r}: (")
        lines += [f"        {text[i:i + 100]!r}" for i in range(0, len(text), 100)]
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def layout(dest: Path, source: Path | None = None) -> Path:
    """The collection at ``dest/ansible_collections/ddtree/deploy`` (replaced): the source tree, the remote modules
    and ``galaxy.yml``'s version set to this package's. Returns the collection directory."""
    src = source or source_dir()
    coll = dest / "ansible_collections" / NAMESPACE / NAME
    if coll.exists():
        shutil.rmtree(coll)
    shutil.copytree(src, coll, ignore=_SKIP)
    (coll / GENERATED).write_text(render_programs(host_programs()))
    galaxy = coll / "galaxy.yml"
    doc = yaml.safe_load(galaxy.read_text())
    doc["version"] = __version__
    galaxy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return coll


def build(out: Path, work: Path | None = None) -> Path:
    """``ansible-galaxy collection build`` of the laid-out collection into ``out``: the artifact's path."""
    work = work or out / "work"
    coll = layout(work)
    out.mkdir(parents=True, exist_ok=True)
    galaxy = shutil.which("ansible-galaxy") or str(Path(__import__("sys").executable).with_name("ansible-galaxy"))
    proc = subprocess.run([galaxy, "collection", "build", "--force", "--output-path", str(out), str(coll)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"ansible-galaxy collection build failed:\n{proc.stdout}\n{proc.stderr}")
    return out / f"{NAMESPACE}-{NAME}-{__version__}.tar.gz"


def content_key(source: Path | None = None) -> str:
    """A digest of what a laid-out collection holds (its source files and the remote modules' zips)."""
    src = source or source_dir()
    h = hashlib.sha256(__version__.encode())
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes())
    for name, blob in host_programs()["programs"].items():  # type: ignore[union-attr]
        h.update(name.encode() + blob)
    return h.hexdigest()[:16]


def ensure(cache: Path) -> Path:
    """A collections path holding this package's collection, laid out once per content under ``cache``."""
    key = content_key()
    dest = cache / f"collection-{key}"
    if not (dest / "ansible_collections" / NAMESPACE / NAME / GENERATED).is_file():
        tmp = cache / f".collection-{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        layout(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest
