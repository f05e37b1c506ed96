"""The patch-set format: ``patches/<name>/<package>-<version>/patchset.yaml`` plus its ``.patch`` series.

Loading validates everything a hostile or sloppy patch set could get wrong *before* any file is staged: schema
(every error names the file and field), series entries that leave the patch-set directory or are symlinks, patches
whose paths leave the package (``../``, absolute, ``.git``), symlinks or submodules created by a patch (mode
120000/160000), binary patches, deletions and renames (an overlay can only add or replace files), vendored runtime
files that are symlinks or leave the package, files over the size limit, hard links (a second name for a file that
may live outside the patch set), and anything that is not source: compiled or binary files (``.pyc``, ``.so``, a
``.pth``, ``__pycache__``) as a patch's target or a vendored file, and vendored files that are not UTF-8 text. A
loaded :class:`PatchSet` is
therefore safe to hand to the apply engine (``apply``) and the developer workflow (``dev``). The diffs themselves
are parsed (and refused) by ``diff``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import paths
from ..errors import InputError, PatchDoesNotApply
from ..schema import StrMap, Strict, checked, load_yaml, setting, validate
from .diff import PatchFile, check_path_in_package, parse_patch
from .hooks import Hook, Plugin, check_hook_fields

#: Largest file a patch set may ship (a patch, a vendored runtime file, the YAML): protects the tool and the hosts
#: from a patch set that smuggles in a blob. Real DDTree patches are a few KiB.
MAX_FILE_BYTES = 2 * 1024 * 1024
PATCHSET_FILE = "patchset.yaml"
#: Directories of a runtime directory that hold build products (Python writes __pycache__ when the runtime's own
#: tests import it), never vendored.
RUNTIME_SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
#: What an overlay may never carry, as a patch's target or a vendored file: compiled or binary files (a sourceless
#: ``x.pyc`` beside the package's modules is imported as ``x``; a ``.pth`` runs code at start-up). An overlay
#: carries source only; the host compiles it with its own Python.
NOT_SOURCE_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dll", ".dylib", ".exe", ".o", ".a", ".pth", ".egg", ".whl",
                       ".zip", ".tar", ".gz", ".xz", ".bz2", ".zst")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_SERIES_ENTRY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}\.(patch|diff)$")


def default_patches_root() -> Path:
    """Where named patch sets live: ``$DDTREE_PATCHES``, else the checkout's ``patches/``, else the packaged ones
    (never the current directory's ``patches/``: see ddtree_deploy.paths)."""
    return paths.patches_root()


# -- the patch set -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Runtime:
    """Vendored files copied whole into the overlay: ``files`` maps overlay path → source file."""

    source: Path
    dest: str
    files: tuple[tuple[str, Path], ...]


@dataclass(frozen=True)
class PatchSet:
    """A validated patch set: metadata, the parsed series, and the runtime files it vendors."""

    name: str
    version: str
    description: str
    yaml_path: Path
    base_package: str
    base_version: str
    base_files: dict[str, str]
    requires: dict[str, str]
    patches: tuple[PatchFile, ...]
    runtime: Runtime | None
    vendor: tuple[Runtime, ...] = ()
    plugin: Plugin | None = None
    hooks: tuple[Hook, ...] = ()
    traits: dict[str, Any] = field(default_factory=dict)  # this base's row of what the vendored code reads
    traits_file: str | None = None  # overlay path of the generated table of the family's traits (JSON)
    stack: dict[str, Any] | None = None  # what the base's wheel pins (``stack:``), for the ABI check
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def vendored(self) -> tuple[Runtime, ...]:
        """Every directory the overlay carries whole: the runtime first, then the ``vendor`` entries."""
        return ((self.runtime,) if self.runtime else ()) + self.vendor

    @property
    def dir(self) -> Path:
        return self.yaml_path.parent

    @property
    def series(self) -> list[str]:
        return [p.name for p in self.patches]

    @property
    def qualified_name(self) -> str:
        """``<name>/<directory>``, e.g. ``ddtree/sglang-0.5.11``: what ``load_patchset`` takes back."""
        return f"{self.name}/{self.dir.name}"

    def touched_files(self) -> dict[str, str]:
        """Every file the series changes → the first patch that changes it (in series order)."""
        out: dict[str, str] = {}
        for p in self.patches:
            for path in p.touched:
                out.setdefault(path, p.name)
        return out

    def created_files(self) -> dict[str, str]:
        """Files the series creates (not in the base) → the patch that creates them."""
        return {f.path: p.name for p in self.patches for f in p.files if f.new_file}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.qualified_name, "version": self.version, "description": self.description,
            "path": str(self.yaml_path),
            "base": {"package": self.base_package, "version": self.base_version, "files": dict(self.base_files)},
            "requires": dict(self.requires),
            "series": [{"name": p.name, "subject": p.subject, "files": p.touched,
                        "added": p.stat()[0], "removed": p.stat()[1],
                        **{k: getattr(p, k) for k in LIFECYCLE_FIELDS if getattr(p, k)}} for p in self.patches],
            "runtime": None if self.runtime is None else {
                "source": str(self.runtime.source), "dest": self.runtime.dest,
                "files": [dest for dest, _ in self.runtime.files]},
            "vendor": [{"source": str(v.source), "dest": v.dest, "files": [dest for dest, _ in v.files]}
                       for v in self.vendor],
            "plugin": None if self.plugin is None else dict(self.plugin.__dict__),
            "hooks": [{k: v for k, v in h.__dict__.items() if k != "index" and v} for h in self.hooks],
            "traits": dict(self.traits), "traits_file": self.traits_file, "stack": self.stack,
        }


def _check_name(value: str) -> str | None:
    return None if _NAME.match(value) else "expected a lower-case name (letters, digits, '.', '_', '-')"


def _check_version(value: str) -> str | None:
    try:
        Version(value)
    except InvalidVersion:
        return "expected a version such as 0.5.11"
    return None


def _check_requires(value: dict[str, Any]) -> str | None:
    for key, spec in value.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            return f"requirement {key!r} has an invalid version specifier {spec!r} (expected e.g. '>=2.11,<2.12')"
    return None


def _check_series_name(value: str) -> str | None:
    if "/" in value or "\\" in value or value.startswith("."):
        return "a series entry must be a file name inside the patch-set directory (no '/', no '..')"
    return None if _SERIES_ENTRY.match(value) else "expected a file name ending in .patch or .diff"


#: The fields a series entry may carry besides its file name (``- patch: NAME`` form).
LIFECYCLE_FIELDS = ("applies_to", "superseded_by", "upstream_merged")


def _check_series_entry(value: Any) -> str | None:
    """A file name, or a mapping ``{patch: NAME, applies_to: SPEC, superseded_by: NAME, upstream_merged: VER}``."""
    if isinstance(value, str):
        return _check_series_name(value)
    if not isinstance(value, dict) or not isinstance(value.get("patch"), str):
        return "expected a patch file name, or a mapping with 'patch' (and applies_to / superseded_by / upstream_merged)"
    unknown = sorted(set(value) - {"patch", *LIFECYCLE_FIELDS})
    if unknown:
        return f"unknown field {unknown[0]!r} (a series entry has patch, {', '.join(LIFECYCLE_FIELDS)})"
    for key in ("applies_to", "superseded_by", "upstream_merged"):
        if key in value and not isinstance(value[key], str):
            return f"{key}: expected a string (quote versions: '0.5.20')"
    if "applies_to" in value:
        try:
            SpecifierSet(value["applies_to"])
        except InvalidSpecifier:
            return f"applies_to: {value['applies_to']!r} is not a version specifier (e.g. '>=0.5.14,<0.5.20')"
    if "upstream_merged" in value and _check_version(value["upstream_merged"]):
        return f"upstream_merged: {value['upstream_merged']!r} is not a version (the first base that has the change)"
    if "superseded_by" in value and _check_series_name(value["superseded_by"]):
        return f"superseded_by: {_check_series_name(value['superseded_by'])}"
    return _check_series_name(value["patch"])


_TRAIT = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _check_traits(value: dict[Any, Any]) -> str | None:
    for key, v in value.items():
        if not isinstance(key, str) or not _TRAIT.match(key):
            return f"trait {key!r} is not a lower-case identifier (e.g. draft_width)"
        if not isinstance(v, (str, bool, int)) or isinstance(v, float):
            return f"trait {key!r}: expected true / false, an integer or a word, got {v!r}"
    return None


def _check_python_floor(value: str) -> str | None:
    return None if re.match(r"^3\.\d{1,2}$", value) else "expected a Python release such as '3.11' (quote it)"


def _check_cuda_major(value: int) -> str | None:
    return None if 10 <= value <= 99 else "expected a CUDA major such as 13"


Name = checked(str, _check_name)
VersionText = checked(str, _check_version)
Traits = checked(dict[Any, Any], _check_traits, "a mapping of trait names to true / false, an integer or a word")


class _Base(Strict):
    package: Name = setting()
    version: VersionText = setting(help="quote it: '0.5.11'")
    files: dict[Any, Any] = setting(factory=dict, help="sha256 of every base file the series touches")


class _Runtime(Strict):
    source: Optional[str] = setting(None, help="directory of vendored files, relative to patchset.yaml")
    dest: Optional[str] = setting(None, help="where they go in the package, e.g. sglang/srt/speculative/ddtree")


class _Vendor(Strict):
    source: str = setting(help="directory of vendored files, relative to patchset.yaml")
    dest: str = setting(help="where they go in the package")


class _Plugin(Strict):
    name: Name = setting(help="the entry point's name in group sglang.srt.plugins (what SGLANG_PLUGINS lists)")
    entry: str = setting(help="module:function that registers the hooks, in the vendored code")
    hooks_file: str = setting(help="where the overlay puts the generated hook table (JSON), e.g. "
                              "sglang/srt/speculative/ddtree_v2/plugin_hooks.json")


class _Stack(Strict):
    """``stack:``: what the base's wheel METADATA pins (``patchset port`` writes it; the ABI check reads it)."""

    torch: VersionText = setting(help="the exact torch the base pins (Requires-Dist torch==)")
    kernel: VersionText = setting(help="the exact sglang-kernel it pins")
    flashinfer: VersionText = setting(help="the exact flashinfer-python it pins")
    python: checked(str, _check_python_floor) = setting(help="Requires-Python's floor, e.g. '3.11'")
    cuda: Optional[checked(int, _check_cuda_major)] = setting(
        None, help="the one CUDA major its compiled companions are built on (null: either)")


class _Hook(Strict):
    target: str = setting(help="qualified name of the function, method or class hooked")
    type: str = setting(help="before, after, around or replace")
    hook: str = setting(help="module:function implementing it, in the vendored code")
    sha256: str = setting(help="sha256 of the target's definition in the base")
    source: Optional[str] = setting(None, help="FILE.py::Class.method where an inherited target is defined")
    why: str = setting("")


class PatchSetFile(Strict):
    """``patchset.yaml``."""

    name: Name = setting(help="patch-set name, e.g. ddtree")
    version: VersionText = setting(help="version of the patch set itself")
    description: str = setting("")
    base: _Base = setting(help="the package release the series was made against")
    requires: checked(StrMap, _check_requires) = setting(factory=dict)
    series: list[checked(Union[str, dict[Any, Any]], _check_series_entry,
                         expect="a patch file name, or a mapping with 'patch'")] = setting()
    runtime: Optional[_Runtime] = setting(None)
    # More directories vendored whole, like the runtime (e.g. integration code shared by several bases).
    vendor: list[_Vendor] = setting(factory=list)
    # Changes delivered as hooks through SGLang's plugin framework (patchset/hooks.py) instead of text patches.
    plugin: Optional[_Plugin] = setting(None)
    hooks: list[_Hook] = setting(factory=list)
    # What the base's own folder says about it besides the series (patchset/traits.py).
    stack: Optional[_Stack] = setting(None)
    traits: Traits = setting(factory=dict, help="this base's facts the vendored code reads")
    traits_file: Optional[str] = setting(None, help="where the overlay puts the generated table of every base's "
                                         "traits (JSON), e.g. sglang/srt/speculative/ddtree_v2/bases.json")


def check_regular_file(path: Path, *, what: str) -> None:
    """Refuse (InputError naming `what` and the path) a missing file, a symlink, a hard link, anything but a regular
    file, and a file over the size limit: a patch set is untrusted input and may not reach outside itself.

    A file with a second name (``st_nlink > 1``) may be the other name of any file of this machine (a key, a
    password file): refused like a symlink, except in the patch sets installed with the tool itself, which a
    package manager may hard-link from its cache and which are as trusted as the tool's own code."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"{what} {path} is a symlink: refused")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path} is not a regular file: refused")
    if st.st_nlink > 1 and not _installed_with_the_tool(path):
        raise InputError(f"{what} {path} is a hard link ({st.st_nlink} names for one file, the others possibly outside "
                         "the patch set): refused", hint="copy the file (cp, not ln) into the patch set")
    if st.st_size > MAX_FILE_BYTES:
        raise InputError(f"{what} {path} is {st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit per file")


def _installed_with_the_tool(path: Path) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(paths.PACKAGED_PATCHES.resolve())
    except OSError:
        return False


def read_limited(path: Path, *, what: str) -> bytes:
    """Read a regular file that is not a symlink, not a hard link and not over the size limit."""
    check_regular_file(path, what=what)
    return path.read_bytes()


def check_source_path(path: str, *, what: str) -> None:
    """Refuse an overlay path that is not source: a compiled or binary file, or anything under ``__pycache__``."""
    parts = path.split("/")
    if "__pycache__" in parts or path.lower().endswith(NOT_SOURCE_SUFFIXES):
        raise InputError(f"{what}: {path} is not a source file (compiled, binary or a .pth): refused; an overlay "
                         "carries source only, compiled on the host by its own Python")


def read_vendored(path: Path, *, what: str) -> bytes:
    """A vendored file's bytes: a regular file of its own (no symlink, no hard link), within the size limit, and
    UTF-8 text with no NUL byte (source, never a binary)."""
    data = read_limited(path, what=what)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not a source file: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                         f"offset {exc.start}): refused; a vendored file must be source text") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(f"{what} {path} is not a source file: it holds a NUL byte (offset {nul}): refused; a vendored "
                         "file must be source text")
    return data


def load_patchset(name_or_path: str | Path, *, root: Path | None = None) -> PatchSet:
    """Load and fully validate a patch set by path (file or directory) or name (``ddtree/sglang-0.5.11``).

    A bare name (``ddtree``) needs a base version: use :func:`find_patchset_for`.
    """
    yaml_path = resolve_patchset_path(name_or_path, root=root)
    return _load_yaml(yaml_path)


def resolve_patchset_path(name_or_path: str | Path, *, root: Path | None = None) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p.resolve()
    if (p / PATCHSET_FILE).is_file():
        return (p / PATCHSET_FILE).resolve()
    root = root or default_patches_root()
    text = str(name_or_path)
    if "/" in text and not text.startswith((".", "/")):
        candidate = root / text / PATCHSET_FILE
        if candidate.is_file():
            return candidate.resolve()
        available = ", ".join(list_patchset_names(root)) or "none"
        raise InputError(f"patch set {text!r}: no {candidate} (available under {root}: {available})")
    if _NAME.match(text) and (root / text).is_dir():
        bases = [d.name for d in sorted((root / text).iterdir()) if (d / PATCHSET_FILE).is_file()]
        if len(bases) == 1:  # only one base: no ambiguity
            return (root / text / bases[0] / PATCHSET_FILE).resolve()
        # no flag is suggested here: the commands that take --base/--snapshot choose the folder by it before
        # reaching this, and the others (patchset show, refresh) have no such flag
        raise InputError(f"patch set {text!r} has one folder per base ({', '.join(bases) or 'none'}): "
                         f"name one (e.g. {text}/{bases[0] if bases else 'sglang-X'})")
    raise InputError(f"patch set {text!r} not found: not a file, not a directory with {PATCHSET_FILE}, "
                     f"not a name under {root}")


def list_patchset_names(root: Path | None = None) -> list[str]:
    """Every ``<name>/<dir>`` under the patches root that has a patchset.yaml."""
    root = root or default_patches_root()
    if not root.is_dir():
        return []
    return sorted(f"{y.parent.parent.name}/{y.parent.name}" for y in root.glob(f"*/*/{PATCHSET_FILE}"))


def find_patchset_for(name: str, base_version: str, *, package: str = "sglang", root: Path | None = None,
                      allow_drift: bool = False) -> PatchSet:
    """The patch set ``name`` made for ``package==base_version``.

    With ``allow_drift`` and no exact match, the one with the highest base version not above ``base_version``
    (else the lowest) is returned; the apply step then reports the drift loudly.
    """
    if "/" in name or Path(name).exists():
        return load_patchset(name, root=root)
    root = root or default_patches_root()
    folder = root / name
    candidates = sorted(folder.glob(f"*/{PATCHSET_FILE}")) if folder.is_dir() else []
    if not candidates:
        raise InputError(f"no patch set named {name!r} under {root} (available: {', '.join(list_patchset_names(root)) or 'none'})")
    loaded = [_load_yaml(c.resolve()) for c in candidates]
    mine = [ps for ps in loaded if ps.base_package == package]
    for ps in mine:
        if ps.base_version == base_version:
            return ps
    bases = ", ".join(ps.base_version for ps in mine) or "none"
    if allow_drift and mine:
        target = Version(base_version)
        below = [ps for ps in mine if Version(ps.base_version) <= target]
        pick = max(below, key=lambda ps: Version(ps.base_version)) if below else min(mine, key=lambda ps: Version(ps.base_version))
        return pick
    raise PatchDoesNotApply(
        f"patch set {name!r} has no series for {package} {base_version} (bases it supports: {bases})",
        hint="port it with `ddtree-deploy patchset dev` + `refresh`, or pass --allow-base-drift to try the nearest one",
    )


def read_patchset_file(yaml_path: Path) -> tuple[Any, dict[str, Any]]:
    """``patchset.yaml`` read and its fields validated (the document, and the data with defaults), without the
    series or the vendored files: what a reader of one section (traits, stack) needs."""
    src = str(yaml_path)
    raw_bytes = read_limited(yaml_path, what="patch-set file")
    try:
        doc = load_yaml(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{src}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{src}: invalid YAML: {exc}") from None
    return doc, validate(doc, PatchSetFile, source=src)


def _load_yaml(yaml_path: Path) -> PatchSet:
    src = str(yaml_path)
    doc, data = read_patchset_file(yaml_path)
    base = data["base"]
    package = base["package"]
    ps_dir = yaml_path.parent

    expect_dir = f"{package}-{base['version']}"
    if re.match(rf"^{re.escape(package)}-\d", ps_dir.name) and ps_dir.name != expect_dir:
        raise InputError(f"{src}: field 'base.version': {base['version']!r} does not match the directory name "
                         f"{ps_dir.name!r} (expected {expect_dir!r})")

    files: dict[str, str] = {}
    for path, digest in (base["files"] or {}).items():
        if not isinstance(path, str):
            raise InputError(f"{src}: field 'base.files': key {path!r} is not a path string")
        check_path_in_package(path, package, what=f"{src}: field 'base.files'")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise InputError(f"{src}: field 'base.files.{path}': expected a sha256 hex digest (64 lower-case hex "
                             f"characters), got {digest!r}")
        files[path] = digest

    entries = [e if isinstance(e, dict) else {"patch": e} for e in data["series"]]
    names = [e["patch"] for e in entries]
    if len(set(names)) != len(names):
        dup = next(s for s in names if names.count(s) > 1)
        raise InputError(f"{src}: field 'series': {dup!r} is listed twice")
    for idx, e in enumerate(entries):
        if e.get("superseded_by") and e["superseded_by"] not in names:
            raise InputError(f"{src}: field 'series[{idx}].superseded_by': {e['superseded_by']!r} is not in the series")
    patches = []
    for idx, entry in enumerate(names):
        ppath = ps_dir / entry
        if ppath.is_symlink():
            raise InputError(f"{src}: field 'series[{idx}]': {entry} is a symlink: refused (patches must be files in {ps_dir})")
        if ppath.resolve().parent != ps_dir.resolve():
            raise InputError(f"{src}: field 'series[{idx}]': {entry!r} is not inside the patch-set directory {ps_dir}")
        body = read_limited(ppath, what=f"{src}: field 'series[{idx}]': patch")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{ppath}: not UTF-8 text") from None
        subject, fps, is_mbox = parse_patch(text, source=str(ppath), package=package)
        for fp in fps:
            check_source_path(fp.path, what=f"{ppath}")
        patches.append(PatchFile(name=entry, path=ppath, subject=subject, files=fps, is_mbox=is_mbox,
                                 **{k: entries[idx][k] for k in LIFECYCLE_FIELDS if k in entries[idx]}))

    ps = PatchSet(name=data["name"], version=data["version"], description=data["description"], yaml_path=yaml_path,
                  base_package=package, base_version=base["version"], base_files=files,
                  requires={k: str(v) for k, v in data["requires"].items()}, patches=tuple(patches),
                  runtime=_load_runtime(data["runtime"], ps_dir, package, src),
                  vendor=tuple(_load_runtime(v, ps_dir, package, src, field=f"vendor[{i}]")
                               for i, v in enumerate(data["vendor"])),
                  plugin=Plugin(**data["plugin"]) if data["plugin"] else None,
                  hooks=tuple(check_hook_fields(h, i, src) for i, h in enumerate(data["hooks"])),
                  traits=dict(data["traits"]), traits_file=data["traits_file"], stack=data["stack"], raw=doc)
    _cross_check(ps, src)
    _check_plugin(ps, src)
    _check_generated(ps, src)
    return ps


def _load_runtime(spec: dict[str, Any], ps_dir: Path, package: str, src: str, *,
                  field: str = "runtime") -> Runtime | None:
    if not spec or not any(spec.values()):  # not given, or given empty
        return None
    for key in ("source", "dest"):
        if not spec.get(key):
            raise InputError(f"{src}: missing required field '{field}.{key}'")
    dest = spec["dest"].rstrip("/")
    check_path_in_package(dest, package, what=f"{src}: field '{field}.dest'")
    check_source_path(dest, what=f"{src}: field '{field}.dest'")
    if Path(spec["source"]).is_absolute():
        raise InputError(f"{src}: field '{field}.source': must be relative to {PATCHSET_FILE}, got {spec['source']!r}")
    family = ps_dir.parent.resolve()  # patches/<name>/: the runtime may be shared by the bases of one patch set
    source = (ps_dir / spec["source"]).resolve()
    if source != family and family not in source.parents:
        raise InputError(f"{src}: field '{field}.source': {spec['source']!r} leaves {family} (the patch set's folder)")
    if not source.is_dir():
        raise InputError(f"{src}: field '{field}.source': {source} is not a directory")
    files: list[tuple[str, Path]] = []
    for rel, path in _walk_runtime(source, src):
        out_path = f"{dest}/{rel}"
        check_path_in_package(out_path, package, what=f"{src}: {field} file")
        files.append((out_path, path))
    if not files:
        raise InputError(f"{src}: field '{field}.source': {source} has no files to vendor")
    return Runtime(source=source, dest=dest, files=tuple(sorted(files)))


def _walk_runtime(source: Path, src: str) -> Iterator[tuple[str, Path]]:
    """Every regular file under ``source`` (skipping cache directories), refusing symlinks, hard links, specials,
    oversized files and what is not source text (a loose ``.pyc`` outside ``__pycache__`` is a sourceless module)."""
    for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if d in RUNTIME_SKIP_DIRS:
                dirnames.remove(d)
            elif (base / d).is_symlink():
                raise InputError(f"{src}: runtime directory {base / d} is a symlink: refused")
        dirnames.sort()
        for name in sorted(filenames):
            path = base / name
            check_source_path(path.relative_to(source).as_posix(), what=f"{src}: runtime file {path}")
            read_vendored(path, what=f"{src}: runtime file")
            yield path.relative_to(source).as_posix(), path


def _cross_check(ps: PatchSet, src: str) -> None:
    """Series and metadata agree: hashes for every base file touched, no file both patched and vendored."""
    created: set[str] = set()
    for p in ps.patches:
        for f in p.files:
            if f.new_file:
                if f.path in created:
                    raise InputError(f"{p.path}: creates {f.path}, which an earlier patch of the series created")
                created.add(f.path)
            elif f.path not in created and f.path not in ps.base_files:
                raise InputError(f"{src}: field 'base.files': no sha256 for {f.path}, which {p.name} changes "
                                 "(every base file the series touches needs one; `patchset refresh` writes them)")
    owners: dict[str, str] = {}
    for i, v in enumerate(ps.vendored):
        name = "runtime" if (ps.runtime is not None and i == 0) else f"vendor[{i - (ps.runtime is not None)}]"
        for dest, _ in v.files:
            if dest in owners:
                raise InputError(f"{src}: field '{name}.dest': {dest} is vendored twice ({owners[dest]} and {name})")
            owners[dest] = name
    clash = sorted(set(ps.touched_files()) & set(owners))
    if clash:
        raise InputError(f"{src}: field '{owners[clash[0]]}.dest': {clash[0]} is both patched by the series and "
                         "vendored; keep one owner per file")


def _check_generated(ps: PatchSet, src: str) -> None:
    """The traits table goes where a generated file may: a new .json file of the package that nothing else
    writes; and there are traits to put in it."""
    tf = ps.traits_file
    if tf is None:
        return
    if not ps.traits:
        raise InputError(f"{src}: field 'traits_file': the patch set has no traits to write there; add 'traits' "
                         "or drop 'traits_file'")
    check_path_in_package(tf, ps.base_package, what=f"{src}: field 'traits_file'")
    if not tf.endswith(".json"):
        raise InputError(f"{src}: field 'traits_file': {tf!r} must be a .json file")
    vendored = {dest for v in ps.vendored for dest, _ in v.files}
    if tf in vendored or tf in ps.touched_files() or (ps.plugin is not None and tf == ps.plugin.hooks_file):
        raise InputError(f"{src}: field 'traits_file': {tf} is also vendored, patched or the hook table; it is "
                         "generated")


def _check_plugin(ps: PatchSet, src: str) -> None:
    """Hooks and their plugin agree: a plugin for hooks, each implementation a function of the vendored code, the
    hook table a new JSON file of the package, no target hooked twice by the same type."""
    if ps.hooks and ps.plugin is None:
        raise InputError(f"{src}: field 'plugin': the patch set has hooks but no plugin (entry, hooks_file) to "
                         "register them")
    if ps.plugin is None:
        return
    if not ps.hooks:
        raise InputError(f"{src}: field 'hooks': a plugin without hooks registers nothing; drop 'plugin'")
    vendored = {dest: path for v in ps.vendored for dest, path in v.files}
    hf = ps.plugin.hooks_file
    check_path_in_package(hf, ps.base_package, what=f"{src}: field 'plugin.hooks_file'")
    if not hf.endswith(".json"):
        raise InputError(f"{src}: field 'plugin.hooks_file': {hf!r} must be a .json file")
    if hf in vendored or hf in ps.touched_files():
        raise InputError(f"{src}: field 'plugin.hooks_file': {hf} is also vendored or patched; it is generated")

    def impl(value: str, where: str) -> None:
        module, func = value.split(":", 1) if ":" in value else (value, "")
        stem = module.replace(".", "/")
        path = vendored.get(f"{stem}.py") or vendored.get(f"{stem}/__init__.py")
        if path is None or not func:
            raise InputError(f"{src}: field '{where}': {value!r} is not module:function of a vendored file "
                             f"(vendored: {', '.join(sorted(v.dest for v in ps.vendored)) or 'none'})")
        import ast

        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == func
                   for n in tree.body):
            raise InputError(f"{src}: field '{where}': {path} defines no function {func!r}")

    impl(ps.plugin.entry, "plugin.entry")
    seen: set[tuple[str, str]] = set()
    for h in ps.hooks:
        impl(h.hook, f"hooks[{h.index}].hook")
        if (h.target, h.type) in seen:
            raise InputError(f"{src}: field 'hooks[{h.index}]': {h.type} {h.target} is hooked twice; keep one")
        seen.add((h.target, h.type))
