"""What ``apply`` does on a host, decided once: from what was read (the local snapshot store, the host's release
state, the running server's launch line, whether a generation baseline exists) and the overlay, the list of steps.

``apply`` executes that list (``deploy.deploy_overlay``); ``apply --dry-run`` prints the same list and writes
nothing anywhere (not the host, not the local snapshot store: a missing or stale snapshot is the step "snapshot").
The rule for "unchanged" lives here only: the active release holds this overlay, is marked good, and the server
was started with what the host file asks for now (its command and flags, or its systemd drop-in, and its
environment). A change of flags alone is a restart on the same release (the step says which flags changed);
anything else is a new release. Pure functions of their inputs: no connection, no clock except the one given.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from .hoststate import ReleaseState
from .inventory import Host
from .overlay import Overlay
from .server import ServerControl, server_kind, server_spec

#: the actions a step can take, in the order they can occur
ACTIONS = ("snapshot", "settle", "baseline", "push", "switch", "check", "restart", "probe")


@dataclass(frozen=True)
class Step:
    """One step: ``action`` (one of ACTIONS), what it does in words, and what the executor needs."""

    action: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """The steps, whether they change the host (None: not known before a snapshot is taken), and why."""

    steps: tuple[Step, ...]
    changed: bool | None
    reason: str
    flag_diff: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        """An Ansible-like one-liner: ``changed=0`` when nothing would change."""
        mark = "?" if self.changed is None else str(int(self.changed))
        return f"changed={mark}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "reason": self.reason, "summary": self.summary,
                "flag_diff": list(self.flag_diff), "steps": [asdict(s) for s in self.steps]}


@dataclass(frozen=True)
class Observed:
    """What was read from the host: its release state (``state.json``), the running server's launch record
    (``remote/server.py`` ``launch``: None when unknown), and whether a generation baseline is recorded."""

    state: ReleaseState
    launch: dict[str, Any] | None
    has_baseline: bool


# -- the snapshot -------------------------------------------------------------------------------------------------------
def snapshot_step(latest_id: str | None, created: Any, max_age: float, now: float | None = None) -> Step | None:
    """The step "snapshot" when the local store has no snapshot of the host, or only one older than ``max_age``."""
    if latest_id is None:
        return Step("snapshot", "take a snapshot of the installed sglang (the local store has none of this host)",
                    {"why": "missing"})
    try:
        stamp = datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
    except ValueError:
        stamp = float("-inf")
    age = (time.time() if now is None else now) - stamp
    if age > max_age:
        return Step("snapshot", f"take a fresh snapshot (the latest, {latest_id}, is older than {max_age:.0f} s)",
                    {"why": "stale", "latest": latest_id})
    return None


# -- the server's launch line vs the host file -------------------------------------------------------------------------
def wanted_launch(host: Host, ddtree: bool = True) -> str:
    """What the host file says the server runs with (DDTree on: an overlay is active; off: the installed package):
    the managed command line or the systemd drop-in."""
    spec = server_spec(host)
    mode = "on" if ddtree else "off"
    return spec[f"dropin_{mode}"] if server_kind(host) == "systemd" else spec.get(f"command_{mode}", "")


def _units(text: str) -> list[str]:
    """A launch line as comparable units: a drop-in by lines, a command by words with each ``--flag value`` kept
    together (so a changed value reads as one flag)."""
    if "\n" in text.strip():
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    units, i = [], 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and "=" not in w and i + 1 < len(words) and not words[i + 1].startswith("-"):
            units.append(f"{w} {words[i + 1]}")
            i += 2
        else:
            units.append(w)
            i += 1
    return units


def launch_drift(host: Host, launch: dict[str, Any] | None, ddtree: bool = True) -> tuple[str, ...] | None:
    """How the running server's launch differs from what the host file says now (``ddtree``: with DDTree on, as
    when an overlay is active), as ``- old`` / ``+ new`` lines; () when it is the same; None when the server's
    launch was never recorded (it cannot be compared)."""
    if not launch or not launch.get("launch"):
        return None
    old, new = _units(str(launch["launch"])), _units(wanted_launch(host, ddtree))
    lines = [f"- {u}" for u in old if u not in new] + [f"+ {u}" for u in new if u not in old]
    if launch.get("ddtree") is not None and bool(launch["ddtree"]) != ddtree:
        lines.insert(0, f"- (started with DDTree {'on' if launch['ddtree'] else 'off'})")
    if "env" in launch:
        was, now = dict(launch.get("env") or {}), dict(server_spec(host)["env"])
        lines += [f"- env {k}={v}" for k, v in sorted(was.items()) if now.get(k) != v]
        lines += [f"+ env {k}={v}" for k, v in sorted(now.items()) if was.get(k) != v]
    return tuple(lines)


# -- the decision ---------------------------------------------------------------------------------------------------------
def decide(observed: Observed, overlay: Overlay, host: Host, *, force: bool = False, record_baseline: bool = True,
           files: int | None = None) -> Decision:
    """The steps of ``apply`` for ``overlay`` on a host in the ``observed`` state (``files``: how many files the
    push changes, when the caller counted them; else the overlay's file count)."""
    state = observed.state
    active = state.active
    rel = state.active_release
    ctl = ServerControl(None, host=host)  # describe() only reads the host file
    steps: list[Step] = []
    pending = state.pending
    if pending:
        steps.append(Step("settle", f"settle release {pending.get('release')}, left switched in but unprobed by run "
                          f"{pending.get('run')} (roll it back, or keep it if it passes its probe)"))
    holds = bool(rel and rel.get("overlay_digest") == overlay.digest) and state.is_good(active)
    if holds and not force:
        drift = launch_drift(host, observed.launch)
        if not drift:
            unknown = "" if drift is not None else " (the server's launch line was not recorded: its flags are not compared)"
            steps.append(Step("probe", f"probe release {active} as it runs; if it passes: nothing else (no new release, "
                              "no restart)", {"release": active, "unchanged": True}))
            return Decision(tuple(steps), False, f"release {active} already holds this overlay and the server runs the "
                            f"host file's flags{unknown}")
        why = "the server's flags differ from the host file"
        steps += [Step("check", f"check release {active} without a server (overlay files, kernel self-test)",
                       {"release": active}),
                  Step("restart", f"restart the server on release {active}: {why}: " + "; ".join(drift)
                       + f" ({ctl.describe('restart', release=active, ddtree=True)})",
                       {"release": active, "why": why, "flag_diff": list(drift)}),
                  Step("probe", f"probe release {active} with the new flags (no rollback: the release is the same; "
                       "fix the host file if it fails)", {"release": active, "rollback": False})]
        return Decision(tuple(steps), True, f"release {active} holds this overlay; {why}", drift)
    if record_baseline and host.probe.get("prompts") and not observed.has_baseline:
        steps.append(Step("baseline", "record a generation baseline first: "
                          + ctl.describe("restart", release=active, ddtree=False) + ", then back"))
    count = len(overlay.files) if files is None else files
    target = active if state.is_good(active) else state.rollback_target(active) if active else None
    # with an overlay active, flags the host file changed are shown with the restart (the new release gets them)
    drift = (launch_drift(host, observed.launch) or ()) if active else ()
    also = f"; the server's flags change too: {'; '.join(drift)}" if drift else ""
    steps += [Step("push", f"build a new release with {count} overlay files (digest {overlay.digest[:12]})",
                   {"files": count}),
              Step("switch", f"switch current to the new release (from {active or 'the installed package'})"),
              Step("check", "check the new release without a server (overlay files, kernel self-test)"),
              Step("restart", ctl.describe("restart", release="<new>", ddtree=True) + also,
                   {"why": "new release", "flag_diff": list(drift)}),
              Step("probe", "probe it; on failure roll back to " + (f"release {target}" if target else "the installed package"),
                   {"rollback": True})]
    if holds:
        reason = f"--force: release {active} already holds this overlay; redone as a new release"
    elif active:
        reason = f"the overlay differs from the one release {active} holds" if state.is_good(active) \
            else f"release {active} is not marked good"
    else:
        reason = "no overlay is active"
    return Decision(tuple(steps), True, reason, drift)


def redecide_after_failed_probe(observed: Observed, overlay: Overlay, host: Host, *, record_baseline: bool,
                                why: str) -> Decision:
    """The active release holds the overlay but fails its probe as it runs: deploy it again as a new release."""
    d = decide(observed, overlay, host, force=True, record_baseline=record_baseline)
    return Decision(d.steps, True, why)


__all__ = ["ACTIONS", "Decision", "Observed", "Step", "decide", "launch_drift", "redecide_after_failed_probe",
           "snapshot_step", "wanted_launch"]
