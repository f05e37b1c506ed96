"""Patch sets: the public entry points other stages call (the deploy stage, the CLI).

The work is split by job: ``diff`` (the unified-diff parser and the refusals of what an overlay cannot be),
``format`` (the YAML + series format and every refusal of hostile input), ``base`` (where base files come from: a
snapshot or a wheel), ``apply`` (all-or-nothing apply onto a staging copy → an Overlay, and the dry-run diff),
``build`` (``patchset build``: the overlay written to a directory), ``dev`` (the quilt-like developer workflow),
``traits`` (what a base's folder says about it besides the series: its traits, generated into the overlay as one
table of the family, and its stack).
"""

from __future__ import annotations

from .apply import ApplyResult, PatchStep, SeriesDoesNotApply, apply_patchset, build_overlay, render_diff
from .base import BaseSource, SnapshotBase, WheelBase, as_base_source, open_base
from .format import (
    MAX_FILE_BYTES,
    PatchFile,
    PatchSet,
    default_patches_root,
    find_patchset_for,
    list_patchset_names,
    load_patchset,
)

__all__ = [
    "ApplyResult", "BaseSource", "as_base_source", "MAX_FILE_BYTES", "PatchFile", "PatchSet", "PatchStep", "SeriesDoesNotApply",
    "SnapshotBase", "WheelBase", "apply_patchset", "build_overlay", "default_patches_root", "find_patchset_for",
    "list_patchset_names", "load_patchset", "open_base", "render_diff",
]
