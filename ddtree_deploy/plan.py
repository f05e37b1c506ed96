"""The local half of ``apply``, before any lock: the host's snapshot (taken when the store has none or only a stale
one; a dry run takes none), the patch set for its sglang version, the overlay built off-host, its diff and ABI
verdict (``plan``); and what a dry run reports as the decision (``dry_run_decision``: the same ``decide`` the real
run executes, read from the host without the lock and without writing anything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .decide import Decision, Observed, Step, decide, snapshot_step
from .dryrun import numstat
from .errors import InputError, OperationFailed
from .inventory import Host
from .overlay import Overlay
from .transaction import Progress, quiet

_quiet = quiet


@dataclass
class Plan:
    """What apply would push: the overlay, its diff against the base, the ABI verdict, and the snapshot's hashes of
    the files it replaces (the host checks them before building). ``snapshot_step``: the snapshot a real run takes
    first (a dry run takes none: with no snapshot at all there is no overlay yet, and ``overlay`` is None)."""

    host: str
    overlay: Overlay | None
    diff: str
    findings: list[Any]
    abi_errors: bool
    snapshot_id: str | None
    base_version: str
    facts: dict[str, Any] | None
    base_hashes: dict[str, str]
    snapshot_step: Step | None = None

    def abi_dicts(self) -> list[dict[str, Any]]:
        return [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in self.findings]

    def stats(self) -> list[dict[str, Any]]:
        """The diff against the base per file (``git apply --numstat``)."""
        if self.overlay is None:
            return []
        return numstat(self.diff, [f.path for f in self.overlay.files if not _is_text(f.content)])


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


DEFAULT_PATCHSET = "ddtree"


def plan(host: Host, *, patchset: str | None = None, max_snapshot_age: float = 3600.0, progress: Progress = _quiet,
         dry_run: bool = False, allow_base_drift: bool = False) -> Plan:
    """Resolve the patch set for the host's base version, build the overlay off-host from the host's latest
    snapshot (taking one if there is none or it is older than ``max_snapshot_age`` seconds), and run the ABI
    check. Touches nothing on the host (taking a snapshot only reads it). ``dry_run``: takes no snapshot (the
    step is in the plan instead) and writes nothing to the local store. ``allow_base_drift``: a base version no
    series is made for takes the nearest series, applied despite the drift (loud)."""
    from . import abi as abi_mod
    from .patchset import SnapshotBase, build_overlay, find_patchset_for, render_diff
    from .snapshot import SnapshotStore

    store = SnapshotStore()
    snap = store.latest(host.name)
    step = snapshot_step(str(snap.id) if snap else None, snap.created if snap else None, max_snapshot_age)
    if step is not None and not dry_run:
        progress(f"{host.name}: taking a snapshot of the installed sglang")
        snap = store.take(host)
    if snap is None:  # a dry run on a host the store has no snapshot of: nothing to build the overlay from
        return Plan(host.name, None, "", [], False, None, "", None, {}, step)
    facts = snap.facts
    base_version = str(snap.package_version or "")
    if not base_version:
        raise OperationFailed(f"host {host.name}: snapshot {snap.id} does not record the installed sglang version")
    ps = find_patchset_for(patchset or DEFAULT_PATCHSET, base_version, allow_drift=allow_base_drift)
    progress(f"{host.name}: applying patch set {ps.name} {ps.version} to snapshot {snap.id} (sglang {base_version})"
             + (f" [bold red]despite base drift: its series is for {ps.base_version}[/bold red]"
                if ps.base_version != base_version else ""))
    try:
        base = SnapshotBase(snap, store=store)
        overlay = build_overlay(ps, base, allow_base_drift=allow_base_drift)
        diff = render_diff(overlay, base)
    except InputError as exc:
        if dry_run or ("store corrupted" not in exc.message and "missing from the store" not in exc.message):
            raise
        # a damaged blob: the host is the source of truth; a fresh snapshot fetches what the store lost
        progress(f"{host.name}: {exc.message}; taking a fresh snapshot to repair the store")
        snap = store.take(host)
        base = SnapshotBase(snap, store=store)
        overlay = build_overlay(ps, base, allow_base_drift=allow_base_drift)
        diff = render_diff(overlay, base)
    carries_compiled = any(f.path.endswith((".so", ".pyd")) for f in overlay.files)
    findings = abi_mod.check_overlay(host.name, facts, built_from_facts=facts, carries_compiled=carries_compiled,
                                     requires=dict(ps.requires), base_version=ps.base_version)
    manifest = snap.manifest
    hashes = {f.path: manifest[f.path]["sha256"] for f in overlay.files if f.action == "replace" and f.path in manifest}
    return Plan(host.name, overlay, diff, findings, abi_mod.has_errors(findings), str(snap.id), base_version, facts, hashes,
                step if dry_run else None)


def dry_run_decision(host: Host, p: Plan, *, record_baseline: bool, force: bool) -> Decision:
    """What ``apply`` would do, read from the host without the lock and without writing anything: the same
    ``decide`` the real run executes, after the snapshot step when the local store needs one."""
    from .hoststate import HostLayout
    from .release import ReleaseManager
    from .server import ServerControl
    from .transport import HostConnection

    with HostConnection(host) as conn:
        state = ReleaseManager(conn).state()
        has_baseline = bool(conn.call("probe", "read_json", timeout=30, path=HostLayout.of(host).baseline))
        observed = Observed(state, ServerControl(conn).launch(), has_baseline)
    first = (p.snapshot_step,) if p.snapshot_step else ()
    if p.overlay is None:
        rest = Step("push", f"build the overlay of patch set {DEFAULT_PATCHSET} from that snapshot, then decide as "
                    "apply does (active release " + (state.active or "none") + "); its files are counted by a "
                    f"dry run once the store has the snapshot (`ddtree-deploy snapshot take {host.name}`)")
        return Decision(first + (rest,), None, "the local store has no snapshot of this host yet")
    d = decide(observed, p.overlay, host, force=force, record_baseline=record_baseline)
    return Decision(first + d.steps, d.changed, d.reason, d.flag_diff)


__all__ = ["DEFAULT_PATCHSET", "Plan", "dry_run_decision", "plan"]
