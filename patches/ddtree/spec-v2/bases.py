"""The spec-v2 bases: what the code and the tests need to know about each base's series, and where it comes from.

The facts live in each base's own folder: ``traits:`` in ``patches/ddtree/sglang-<version>/patchset.yaml``
(``ddtree-deploy patchset port`` copies the previous base's forward, for review). ``patchset build`` writes the
traits of every base into the overlay as ``bases.json`` beside this module (the patch set's ``traits_file``), and
:data:`BASES` is read from it, so ``config``, ``hooks`` and ``hybrid`` know every base, not only the running one.
Loaded by path from the repository (the tests, ``tests/spec_v2_tables.py``), there is no generated file: the tests
build the same table with :func:`table` from the patch sets (``ddtree_deploy.patchset.traits.family_traits``).
Adding a base is its folder; a base that pins other CPU test dependencies also gets a
``tests/sglang_v2/requirements-cpu-<version>.txt`` (the Makefile installs each into its own folder).

Pure data with no import of SGLang or torch (standard library only).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

#: The generated table's name beside this module in the overlay, and the one format of it this code reads.
TABLE_FILE = "bases.json"
TABLE_FORMAT = 1


@dataclass(frozen=True)
class Base:
    """Where the bases' series differ (each series' README says why).

    ``draft_width``: how the draft runner gets the drafter's block size while the target verifies budget + 1:
    "hook" = the target-verify width hook in spec_info.py (0.5.17+), "copy" = the draft worker's own copy of the
    server arguments (``config.draft_server_args``; 0.5.14-0.5.16, whose draft attention backend reads the width
    from that copy). ``tree_in_graph``: the tree build is folded into the draft CUDA graph (a capture hook exists).
    ``grammar``: the base's DFLASH worker does constrained decoding (so DDTree refuses a grammar backend as
    unproven); older bases abort grammar requests in the scheduler. ``schedule``: the series gives each captured
    batch size its own verify width (a budget schedule, ``--speculative-ddtree-adapt``). ``hybrid``: the series has
    patch 0004 (GatedDeltaNet hybrids through the runtime's tree kernels). ``flashinfer``: DDTree's verify input
    builds the base's FlashInfer verify arguments (checked on CPU against the base's own code); where not
    (0.5.22+: those arguments come through a KV-index translator and plan that DDTree's input is not checked
    against), ``--attention-backend flashinfer`` is refused with DDTree. ``meta_info``: a request's DDTree summary
    reaches its ``meta_info`` (its round entries ride SGLang's per-token ``customized_info``, which the output
    streamer aligns per request from 0.5.15; 0.5.14's appends only the requests that have the key, so one batch
    output mixing requests with and without it would misplace them: there only the server-wide ``/metrics``).
    """

    draft_width: str
    tree_in_graph: bool
    grammar: bool
    schedule: bool
    hybrid: bool
    flashinfer: bool
    meta_info: bool


#: The values a word-valued trait takes (every other trait is true / false).
CHOICES = {"draft_width": ("hook", "copy")}


def table(bases: Mapping[str, Mapping[str, Any]], source: str) -> dict[str, Base]:
    """Base version -> :class:`Base`, in the given order (oldest first), each row checked: every trait present,
    none unknown, each of its kind. ``source`` names where the rows came from in an error."""
    names = [f.name for f in fields(Base)]
    out: dict[str, Base] = {}
    for version, row in bases.items():
        where = f"{source}: base {version}"
        unknown = sorted(set(row) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown trait {unknown[0]!r} (known: {', '.join(names)})")
        missing = [n for n in names if n not in row]
        if missing:
            raise ValueError(f"{where}: trait {missing[0]!r} missing")
        for name in names:
            value, allowed = row[name], CHOICES.get(name)
            ok = value in allowed if allowed else isinstance(value, bool)
            if not ok:
                raise ValueError(f"{where}: trait {name!r} is {value!r}, expected "
                                 + (" or ".join(repr(a) for a in allowed) if allowed else "true or false"))
        out[version] = Base(**{n: row[n] for n in names})
    return out


def read(path: Path) -> dict[str, Base]:
    """The table a build generated (``{"format": 1, "patchset": ..., "bases": {version: traits}}``)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT or not isinstance(data.get("bases"), dict):
        raise ValueError(f"{path}: not a bases table of format {TABLE_FORMAT} (rebuild the overlay with this "
                         "patch set's ddtree-deploy)")
    return table(data["bases"], str(path))


#: The bases of the overlay this module runs from, oldest first: read from the generated table beside it when
#: imported as part of a package (the overlay); empty when loaded by path from the repository (the tests build
#: theirs with :func:`table`).
BASES: dict[str, Base] = read(Path(__file__).with_name(TABLE_FILE)) if __package__ else {}


def with_trait(name: str, bases: Mapping[str, Base] | None = None) -> tuple[str, ...]:
    """The bases whose row has ``name`` true, oldest first (of :data:`BASES`, or of ``bases``)."""
    return tuple(v for v, b in (BASES if bases is None else bases).items() if getattr(b, name))
