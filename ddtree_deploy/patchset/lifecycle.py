"""Which patches of a series a base gets: the series entry's lifecycle fields, judged against the base version.

A series entry may say which base versions it is for (``applies_to``, a PEP 440 specifier), which later patch of the
series replaces it (``superseded_by``) and the first base release that contains its change (``upstream_merged``).
For a base version V:

- ``upstream_merged`` <= V: **skip** (the base has the change);
- V below every version ``applies_to`` admits (a patch for newer bases only): **skip**;
- V above ``applies_to``'s cap: **skip** when ``superseded_by`` names its successor, else **refuse** (exit 5): the
  patch was capped below this base and nothing says where its change went, so the series is not for this base;
- otherwise **apply**.

Separately, ``apply`` reports a patch that does not apply but reverse-applies cleanly as ``present`` (already in the
base), a skip, not a failure; ``port`` reports such hunks as ``present`` and drops a patch whose every hunk is.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .diff import PatchFile


def gate(patch: PatchFile, package: str, version: str) -> tuple[str, str]:
    """("apply" | "skip" | "refuse", why) for ``patch`` on ``package`` ``version``."""
    v = Version(version)
    if patch.upstream_merged and v >= Version(patch.upstream_merged):
        return "skip", f"upstream: in {package} since {patch.upstream_merged} (upstream_merged)"
    if not patch.applies_to:
        return "apply", ""
    spec = SpecifierSet(patch.applies_to)
    if spec.contains(v, prereleases=True):
        return "apply", ""
    below = any(s.operator in (">", ">=", "~=", "==") and not s.contains(v, prereleases=True)
                and v < Version(s.version.removesuffix(".*")) for s in spec)
    if below:  # a patch for newer bases than this one
        return "skip", f"applies to {package} {patch.applies_to}: not needed on {version} (applies_to)"
    if patch.superseded_by:
        return "skip", f"applies to {package} {patch.applies_to}; superseded by {patch.superseded_by} on {version}"
    return "refuse", (f"{patch.name} applies to {package} {patch.applies_to} only, and this base is {version}; "
                      "nothing says where its change went (superseded_by / upstream_merged)")
