"""What a base's own folder says about the base besides its series, and how the code that reads it gets it.

``traits:`` in ``patches/<name>/<package>-<version>/patchset.yaml`` are that base's facts the patch set's vendored
code reads (for ddtree, spec-v2's ``bases.py`` says what each one means: how the draft width is set, whether the
series has the hybrid patch, ...). The vendored code runs on the host inside the server, where no ``patchset.yaml``
is: the overlay carries, at the patch set's ``traits_file``, one JSON table of the traits of every base of the
family (``patches/<name>/*/``) that writes the same file, oldest first, so the code also knows the other bases (a
refusal names the bases that have what this one lacks). ``patchset port`` copies the previous base's traits forward
and says so, for review. The table is generated at every build, so adding a base is its folder and nothing else.

``stack:`` is what the base's wheel pins (torch, sglang-kernel, flashinfer-python, its Python floor, the CUDA major
its companions are built on), which the ABI check reads (``abi.stacks``) for every release that has a folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from ..errors import InputError
from .format import PATCHSET_FILE, read_patchset_file

if TYPE_CHECKING:
    from ..overlay import OverlayFile
    from .format import PatchSet

#: The table's own format number (bumped if its shape changes; the reader refuses another).
TABLE_FORMAT = 1


def family_traits(family: Path, traits_file: str | None = None) -> dict[str, dict[str, Any]]:
    """Base version -> its traits, oldest first, for every folder under ``family`` (``patches/<name>/``) whose
    ``patchset.yaml`` has traits (and, given ``traits_file``, writes the table there).

    Every row must name the same traits: a trait only some bases have is refused, naming the file that is out of
    line and the trait (a misspelt trait in one base, or one missing there)."""
    rows: list[tuple[Version, str, dict[str, Any], Path]] = []
    for yaml_path in sorted(family.glob(f"*/{PATCHSET_FILE}")):
        _, data = read_patchset_file(yaml_path)
        if not data["traits"] or (traits_file is not None and data["traits_file"] != traits_file):
            continue
        version = data["base"]["version"]
        clash = next((y for v, _, _, y in rows if v == Version(version)), None)
        if clash is not None:
            raise InputError(f"{yaml_path}: field 'base.version': {version} is also the base of {clash}; one folder "
                             "per base")
        rows.append((Version(version), version, dict(data["traits"]), yaml_path))
    rows.sort(key=lambda r: r[0])
    names = sorted({k for _, _, traits, _ in rows for k in traits})
    for name in names:
        have = [r for r in rows if name in r[2]]
        lack = [r for r in rows if name not in r[2]]
        if not lack:
            continue
        if len(have) <= len(lack):  # the odd one out has it: a trait no other base has (a typo, most often)
            others = sorted(set(names) - {name})
            raise InputError(f"{have[0][3]}: field 'traits.{name}': no other base of {family.name} has this trait "
                             f"(theirs: {', '.join(others) or 'none'})",
                             hint="spell it as the other bases do, or add it to every base")
        raise InputError(f"{lack[0][3]}: field 'traits': missing {name!r}, which the other bases of {family.name} "
                         f"have (e.g. {have[-1][3].parent.name}: {name}: {json.dumps(have[-1][2][name])})",
                         hint="copy it from the previous base and check it against this one")
    return {text: traits for _, text, traits, _ in rows}


def traits_table(patchset: "PatchSet") -> dict[str, Any]:
    """The JSON the vendored code reads: the traits of every base of the patch set's family that writes the same
    table, by base version, oldest first."""
    bases = family_traits(patchset.dir.parent, patchset.traits_file)
    if bases.get(patchset.base_version) != patchset.traits:  # read from the same file: only a race gets here
        raise InputError(f"{patchset.yaml_path}: its traits changed while the overlay was built")
    return {"format": TABLE_FORMAT, "patchset": patchset.name, "bases": bases}


def traits_files(patchset: "PatchSet") -> list["OverlayFile"]:
    """The generated traits table the overlay adds (none for a patch set without ``traits_file``)."""
    from ..overlay import OverlayFile

    if patchset.traits_file is None:
        return []
    text = json.dumps(traits_table(patchset), indent=1) + "\n"
    return [OverlayFile(path=patchset.traits_file, content=text.encode(), action="add")]
