"""A patch set's hooks as a whole: every target checked against a base, and what the overlay carries for them (the
plugin distribution's dist-info and the hook table its entry point registers from). One hook's format, and how a
target is found and hashed in a base, are :mod:`.hooks`'s; this module reads a whole :class:`.format.PatchSet`.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..overlay import OverlayFile
from .format import PatchSet
from .hooks import ENTRY_POINT_GROUP, locate


def dist_name(patchset: PatchSet) -> str:
    """The plugin distribution's name, e.g. ``ddtree_sglang_plugin``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{patchset.name}_{patchset.base_package}_plugin").lower()


def dist_info_dir(patchset: PatchSet) -> str:
    return f"{dist_name(patchset)}-{patchset.version}.dist-info"


def check_hooks(patchset: PatchSet, base: Any) -> list[dict[str, Any]]:
    """Every hook whose target is missing from ``base`` or whose source there is not the recorded one."""
    out = []
    for hook in patchset.hooks:
        loc = locate(hook, base.has, base.read)
        if loc.problem is not None:
            out.append({"hook": hook.label, "target": hook.target, "file": loc.file, "expected": hook.sha256,
                        "found": "missing", "reason": loc.problem})
        elif loc.found != hook.sha256:
            out.append({"hook": hook.label, "target": hook.target, "file": loc.file, "expected": hook.sha256,
                        "found": loc.found, "reason": "the target's source changed"})
    return out


def format_mismatches(patchset: PatchSet, base_label: str, mismatches: list[dict[str, Any]]) -> str:
    lines = [f"{len(mismatches)} hook target(s) of patch set {patchset.qualified_name} differ from the base "
             f"({base_label}); nothing was produced:"]
    for m in mismatches:
        if m["found"] == "missing":
            lines.append(f"  {m['hook']}: {m['reason']}")
        else:
            lines.append(f"  {m['hook']}: {m['target']} in {m['file']} changed: expected sha256 {m['expected']}, "
                         f"found {m['found']}")
    return "\n".join(lines)


# -- what the overlay carries --------------------------------------------------------------------------------------
def hook_table(patchset: PatchSet, hashes: dict[int, str] | None = None) -> dict[str, Any]:
    """The JSON the plugin registers from. ``hashes``: per hook index, the sha256 to record where it is not the
    patch set's (a build under ``--allow-base-drift`` records what the base has)."""
    assert patchset.plugin is not None
    return {"format": 1, "patchset": patchset.qualified_name, "version": patchset.version,
            "base": {"package": patchset.base_package, "version": patchset.base_version},
            "hooks": [{"target": h.target, "type": h.type, "hook": h.hook,
                       "sha256": (hashes or {}).get(h.index, h.sha256), "source": h.source} for h in patchset.hooks]}


def plugin_files(patchset: PatchSet, hashes: dict[int, str] | None = None) -> list[OverlayFile]:
    """The dist-info that declares the entry point, and the hook table; none for a patch set without hooks."""
    plugin = patchset.plugin
    if plugin is None:
        return []
    info = dist_info_dir(patchset)
    metadata = (f"Metadata-Version: 2.1\nName: {dist_name(patchset)}\nVersion: {patchset.version}\n"
                f"Summary: {patchset.qualified_name}: hooks registered through SGLang's plugin framework\n")
    entry = f"[{ENTRY_POINT_GROUP}]\n{plugin.name} = {plugin.entry}\n"
    table = json.dumps(hook_table(patchset, hashes), indent=1, sort_keys=True) + "\n"
    return [OverlayFile(path=f"{info}/METADATA", content=metadata.encode(), action="add"),
            OverlayFile(path=f"{info}/entry_points.txt", content=entry.encode(), action="add"),
            OverlayFile(path=plugin.hooks_file, content=table.encode(), action="add")]
