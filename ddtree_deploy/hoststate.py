"""A host's release root as the control side knows it: where each thing is (``HostLayout``, the one place the
control side spells a path under ``release_root``) and what ``state.json`` says (``ReleaseState``, a frozen view of
the state the host reports).

The host side (``remote/``: stdlib only, shipped to the host as a zip) writes the same layout in its own modules;
``tests/test_hoststate.py`` drives them in process and holds them to the names here::

    <release_root>/
      state.json            releases, the active one, the previous good one, bad ones, the pending switch
      journal.log           one JSON line per event (append-only)
      current -> releases/<id> | base    what the server imports (PYTHONPATH=<root>/current); base/ is empty
      releases/<id>/sglang  a release: a hard-link copy of the installed package with the overlay written in
      staging/<run>/        a push being received
      lock                  the host lock's record (held by its guardian)
      probe-baseline.json   the generation baseline the probe compares against
      server/               the managed server's pid file and log, and launch.json (what it was last started with)
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from .inventory import Host

#: Release statuses that keep a release from being gone back to without ``--force``.
NOT_GOOD = ("bad", "interrupted")


def _under_root(*parts: str) -> property:
    """A path of the layout: ``parts`` joined under the release root."""
    return property(lambda self: posixpath.join(self.root, *parts))


@dataclass(frozen=True)
class HostLayout:
    """The paths under one release root (POSIX paths on the host), one line each."""

    root: str

    state = _under_root("state.json")
    journal = _under_root("journal.log")
    current = _under_root("current")
    #: where ``current`` points when no overlay is active (an empty directory: the installed package wins)
    base = _under_root("base")
    lock = _under_root("lock")
    baseline = _under_root("probe-baseline.json")
    server = _under_root("server")
    server_log = _under_root("server", "server.log")
    server_pid = _under_root("server", "server.pid")
    launch_record = _under_root("server", "launch.json")

    @classmethod
    def of(cls, host: "Host") -> "HostLayout":
        return cls(host.release_root)

    def release(self, release_id: str) -> str:
        return posixpath.join(self.root, "releases", release_id)

    def release_package(self, release_id: str, package: str = "sglang") -> str:
        return posixpath.join(self.release(release_id), package)

    def staging(self, run_id: str) -> str:
        return posixpath.join(self.root, "staging", run_id)


@dataclass(frozen=True)
class ReleaseState:
    """What the host's ``state.json`` says (as the host reports it: ``active`` follows ``current``), read-only.

    ``releases``: the release records, oldest first (``id``, ``status``, ``note``, ``overlay_digest``, ``run``,
    ``exists``, ...); ``active``: the release ``current`` points at (None: the installed package);
    ``previous_good``: the release left by the last switch, the recorded rollback target; ``bad``: releases marked
    bad; ``pending``: a switch to an unprobed release not yet given its verdict (``release``, ``safe``, ``run``,
    ``stage``), or None. ``raw``: the dict as it came (for ``--json``)."""

    releases: tuple[Mapping[str, Any], ...] = ()
    active: str | None = None
    previous_good: str | None = None
    bad: frozenset[str] = frozenset()
    pending: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> "ReleaseState":
        """The view of a ``state`` dict (what ``release show`` returns); a key the host left out takes the value
        the host gives a fresh root (no releases, nothing active, nothing pending)."""
        pending = state.get("pending")
        return cls(releases=tuple(MappingProxyType(dict(r)) for r in state.get("releases") or ()),
                   active=state.get("active"), previous_good=state.get("previous_good"),
                   bad=frozenset(state.get("bad") or ()),
                   pending=MappingProxyType(dict(pending)) if pending else None,
                   raw=MappingProxyType(dict(state)))

    @classmethod
    def read(cls, conn: Any, host: "Host") -> "ReleaseState":
        """The host's state now (one ``release show`` round trip)."""
        return cls.of(conn.call("release", "show", root=host.release_root)["state"])

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r["id"] for r in self.releases)

    def release(self, release_id: str | None) -> Mapping[str, Any] | None:
        """The record of ``release_id`` (None for None, the installed package, or an id the host does not have)."""
        return next((r for r in self.releases if r["id"] == release_id), None) if release_id else None

    @property
    def active_release(self) -> Mapping[str, Any] | None:
        return self.release(self.active)

    def is_good(self, release_id: str | None) -> bool:
        rel = self.release(release_id)
        return bool(rel and rel.get("status") == "good")

    def is_bad(self, release_id: str) -> bool:
        """Marked bad or interrupted, in its record or in the ``bad`` list."""
        rel = self.release(release_id)
        return release_id in self.bad or bool(rel and rel.get("status") in NOT_GOOD)

    @property
    def pending_run(self) -> str | None:
        """The run that left the pending switch (None when nothing is pending)."""
        return self.pending.get("run") if self.pending else None

    def rollback_target(self, failed: str | None) -> str | None:
        """Where to go back to from ``failed``: the recorded previous good release unless it is bad, gone or the
        failed one; else the newest good release; else None (the installed package, always safe). Never derived
        from directory order."""
        bad = self.bad | ({failed} if failed else set())
        prev = self.previous_good
        if prev is None:
            return None  # what ran before the failed switch was the installed package
        rel = self.release(prev)
        if prev not in bad and rel is not None and rel.get("exists", True):
            return prev
        for rel in reversed(self.releases):
            if rel["id"] not in bad and rel.get("status") == "good" and rel.get("exists", True):
                return rel["id"]
        return None


__all__ = ["HostLayout", "NOT_GOOD", "ReleaseState"]
