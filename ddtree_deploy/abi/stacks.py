"""What each SGLang release needs of the host's stack, one row per release, and the rules that read it.

SGLang pins its compiled companions exactly (torch, sglang-kernel, flashinfer-python); every release here asks for
``cuda-python>=13.0``, and from 0.5.18 (torch 2.13 / 2.14) the releases are built for the CUDA 13 stack alone (their
kernels and ``flashinfer_python[cu13]``); 0.5.22 raised its ``Requires-Python`` to 3.11. The rows come from the
patch sets' folders: each ``patches/<name>/sglang-<version>/patchset.yaml`` records in ``stack:`` what that release's
wheel METADATA pins (``Requires-Dist`` / ``Requires-Python``, written by ``patchset port``) and the CUDA major its
companions are built on, so a release with a folder needs no row here. The host's facts carry the pins read from
the installed wheel's own METADATA (``packages.sglang.pins``), and those win; the table adds what the facts do not
carry (the Python floor and the CUDA major) and names the pins for a host whose METADATA could not be read. A release
with no folder is judged by its METADATA pins alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import paths
from ..facts import flashinfer_package, get, kernel_package
from ..patchset.format import PATCHSET_FILE, read_patchset_file
from .findings import ERROR, WARNING, Finding


@dataclass(frozen=True)
class Stack:
    """One SGLang release's needs, as its wheel's METADATA states them."""
    torch: str          # the exact torch release pinned
    kernel: str         # the exact sglang-kernel pinned
    flashinfer: str     # the exact flashinfer-python pinned
    python_min: str     # Requires-Python's floor
    cuda_major: int | None  # the one CUDA major its extras build on (None: whichever torch build the host has)


def stack_table() -> dict[str, Stack]:
    """Release -> its row, from the ``stack:`` of every SGLang patch-set folder under the patches root in use and
    under the tool's own patch sets (the root's first where both have a release), oldest release first."""
    own = paths.checkout_root() / "patches" if paths.checkout_root() else paths.PACKAGED_PATCHES
    rows: dict[str, Stack] = {}
    for root in dict.fromkeys([paths.patches_root().resolve(), own.resolve()]):
        for release, row in _stacks_under(root).items():
            rows.setdefault(release, row)
    return dict(sorted(rows.items(), key=lambda kv: Version(kv[0])))


@lru_cache(maxsize=8)
def _stacks_under(root: Path) -> dict[str, Stack]:
    rows: dict[str, Stack] = {}
    for yaml_path in sorted(root.glob(f"*/*/{PATCHSET_FILE}")):
        _, data = read_patchset_file(yaml_path)
        stack = data["stack"]
        if stack and data["base"]["package"] == "sglang":
            rows.setdefault(Version(data["base"]["version"]).public,
                            Stack(stack["torch"], stack["kernel"], stack["flashinfer"], stack["python"], stack["cuda"]))
    return rows


#: SGLang's companions whose compiled code is built against one exact release of each other: a mismatch does not load.
COMPILED_COMPANIONS = ("sglang-kernel", "flashinfer-python")


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def stack_of(facts: dict[str, Any]) -> tuple[str, Stack] | None:
    """The installed SGLang release and its row, or None when the release is not in the table."""
    installed = _version(get(facts, "packages.sglang.version") or get(facts, "sglang.version"))
    if installed is None:
        return None
    row = stack_table().get(installed.public)
    return (installed.public, row) if row else None


def pins_of(facts: dict[str, Any]) -> dict[str, str]:
    """SGLang's pins on its compiled companions: the installed METADATA's, else the table's (torch's pin is
    ``rules.rule_torch_pins``'s, from the METADATA alone)."""
    pins = dict(get(facts, "packages.sglang.pins") or {})
    found = stack_of(facts)
    if found:
        _, row = found
        pins.setdefault("sglang-kernel", f"=={row.kernel}")
        pins.setdefault("flashinfer-python", f"=={row.flashinfer}")
    return pins


def rule_python_floor(host: str, facts: dict[str, Any]) -> list[Finding]:
    """The host's Python must meet the installed SGLang's Requires-Python (3.11 from 0.5.22)."""
    found, python = stack_of(facts), _version(get(facts, "python.version"))
    if not found or python is None:
        return []
    release, row = found
    if python >= Version(row.python_min):
        return []
    return [Finding(ERROR, host, "python-floor",
                    f"sglang {release} needs Python >= {row.python_min}; the server's Python is {python}",
                    "its code uses syntax and stdlib APIs of newer Pythons: the import fails before the server starts",
                    f"make a venv with Python >= {row.python_min} for sglang {release}, or stay on a release that "
                    f"supports Python {python.major}.{python.minor} (0.5.21 or older)")]


def rule_cuda_major(host: str, facts: dict[str, Any]) -> list[Finding]:
    """From 0.5.18 SGLang builds on CUDA 13 only: a torch built for another CUDA major cannot serve it."""
    found = stack_of(facts)
    if not found or found[1].cuda_major is None or get(facts, "torch.status") != "ok":
        return []
    if get(facts, "gpu.status") == "absent":
        return []  # no GPU: nothing CUDA runs here (check_host's no-gpu finding says so)
    release, row = found
    cuda = get(facts, "torch.cuda")
    major = int(str(cuda).split(".")[0]) if cuda and str(cuda).split(".")[0].isdigit() else None
    if major == row.cuda_major:
        return []
    have = f"torch {get(facts, 'torch.version')} (CUDA {cuda})" if cuda else f"a CPU build of torch ({get(facts, 'torch.version')})"
    return [Finding(ERROR, host, "cuda-stack",
                    f"sglang {release} is built on the CUDA {row.cuda_major} stack (cuda-python>={row.cuda_major}.0, "
                    f"[cu{row.cuda_major}] extras); the host has {have}",
                    f"sglang-kernel and flashinfer for sglang {release} link the CUDA {row.cuda_major} runtime: they "
                    "do not load beside another CUDA major",
                    f"install torch=={row.torch}+cu{row.cuda_major}0 (driver >= 580), or stay on sglang 0.5.17 for "
                    "a CUDA 12 host")]


def rule_companion_pins(host: str, facts: dict[str, Any]) -> list[Finding]:
    """sglang-kernel and flashinfer-python must be exactly the releases SGLang pins (their ops are built together)."""
    if not (get(facts, "packages.sglang.version") or get(facts, "sglang.version")):
        return []
    pins, out = pins_of(facts), []
    installed_by_name = {"sglang-kernel": kernel_package(facts), "flashinfer-python": flashinfer_package(facts)}
    release = get(facts, "packages.sglang.version") or get(facts, "sglang.version")
    for name in COMPILED_COMPANIONS:
        spec_text = (pins.get(name) or "").split(";")[0].strip()
        if not spec_text:
            continue
        try:
            spec = SpecifierSet(spec_text)
        except InvalidSpecifier:
            continue
        found = installed_by_name[name]
        if found is None:
            # a host without a GPU (a CPU sandbox, a packaging-only check) has nothing to run them on
            optional = name == "flashinfer-python" or get(facts, "gpu.status") == "absent"
            out.append(Finding(WARNING if optional else ERROR, host, "companion-pins",
                               f"sglang {release} pins {name}{spec_text}; it is not installed",
                               ("the flashinfer attention backend (SGLang's default on SM120) is unavailable"
                                if name == "flashinfer-python" else "SGLang's own CUDA ops are missing: the server "
                                "cannot start"),
                               f"install {name}{spec_text}"))
            continue
        dist, info = found
        version = _version(info.get("version"))
        if version is None or spec.contains(version, prereleases=True):
            continue
        out.append(Finding(ERROR, host, "companion-pins",
                           f"sglang {release} pins {name}{spec_text}; the host has {dist} {info.get('version')}",
                           f"{name}'s compiled ops are built for the torch and kernels of that exact release: "
                           "`undefined symbol` or a wrong-shape op at the first call",
                           f"install {name}{spec_text} (what `pip install sglang=={release}` would)"))
    return out


def kernel_torch(kernel_version: str) -> tuple[str, list[str]] | None:
    """The torch an sglang-kernel release is built against, read off the SGLang releases that pin that kernel (its
    PyPI build is made for their torch), with those releases; None for a kernel no row names."""
    table = stack_table()
    releases = [r for r, row in table.items() if row.kernel == kernel_version]
    torches = {table[r].torch for r in releases}
    return (torches.pop(), releases) if len(torches) == 1 else None


def rule_kernel_torch(host: str, facts: dict[str, Any]) -> list[Finding]:
    """sglang-kernel is compiled against one torch release: a host torch of another release cannot load its ops."""
    found, torch = kernel_package(facts), _version(get(facts, "torch.version"))
    if found is None or torch is None or found[1].get("requires_torch"):
        return []  # a kernel that pins torch itself is rules.rule_torch_pins' case
    dist, info = found
    built = kernel_torch(str(info.get("version")))
    if built is None or Version(built[0]) == Version(torch.base_version):
        return []
    want, releases = built
    return [Finding(ERROR, host, "kernel-torch",
                    f"{dist} {info.get('version')} is built for torch {want} (the torch sglang "
                    f"{', '.join(releases)} pin); the host has torch {torch}",
                    "its compiled ops link libtorch's C++ symbols of that release: `undefined symbol: _ZN3c10...` "
                    "when SGLang imports it",
                    f"install torch=={want} with the host's CUDA tag, or the {dist} release made for torch "
                    f"{torch.base_version}")]


STACK_RULES = (rule_python_floor, rule_cuda_major, rule_companion_pins, rule_kernel_torch)
