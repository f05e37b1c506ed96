"""``Prober``: the stages run in order against one host, stopping at the first failure. ``check_release`` is the
stages that need no server, ``check_serving`` the ones that do, both read off the stage list (each stage module
says whether it needs the server), so a new stage is its module and its place in ``STAGE_MODULES``."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import Any, Callable

from ..ddtree_stats import ddtree_summary
from ..errors import ConnectionCut, DeployError, RemoteError, TransportError, is_cut
from ..server import ServerControl
from ..transport import HostConnection
from . import generation, overlay, selftest, startup
from .result import ProbeResult, ProbeRun, Stage

#: The stages, in the order they run; each module has NAME, NEEDS_SERVER and run(prober, release, ProbeRun).
STAGE_MODULES: tuple[ModuleType, ...] = (overlay, selftest, startup, generation)
STAGES = tuple(m.NAME for m in STAGE_MODULES)
#: Stages whose failure is shown with the server log's tail.
_WITH_LOG = tuple(m.NAME for m in STAGE_MODULES if m.NEEDS_SERVER)


class Prober:
    """Runs the stages against one host over an open connection."""

    def __init__(self, conn: HostConnection, *, facts: dict[str, Any] | None = None,
                 progress: Callable[[str], None] | None = None, fence: str | None = None) -> None:
        self.conn = conn
        self.fence = fence  # the run holding the host lock (the log reads of a failed stage pass it on)
        self.host = conn.host
        self.facts = facts
        self.progress = progress or (lambda msg: None)

    def call(self, op: str, timeout: float, **args: Any) -> Any:
        """One op of the host's probe module; a connection that died under it is a cut, not a verdict."""
        try:
            return self.conn.call("probe", op, timeout=timeout + 30, **args)
        except (RemoteError, TransportError) as exc:
            if is_cut(exc):
                raise ConnectionCut(self.host.name, f"connection lost during the probe's {op}") from exc
            raise

    # -- one stage on its own ------------------------------------------------------------------------------------------
    def overlay(self, release: str | None) -> Stage:
        return overlay.run(self, release, ProbeRun())

    def selftest(self, release: str | None) -> Stage:
        return selftest.run(self, release, ProbeRun())

    def startup(self, release: str | None) -> Stage:
        """The start-up stage alone (a restart by hand, a benchmark's restart): no generation in its round trip."""
        return startup.run(self, release, ProbeRun())

    def generation(self) -> Stage:
        return generation.run(self, None, ProbeRun())

    def generate(self) -> list[dict[str, Any]]:
        return generation.generate(self)

    # -- the stage list --------------------------------------------------------------------------------------------------
    def check_release(self, release: str | None) -> list[Stage]:
        """The stages that need no server (overlay, selftest), stopping at the first failure: a release that cannot
        load is refused before any restart, while the old server keeps serving."""
        return self._stages([m for m in STAGE_MODULES if not m.NEEDS_SERVER], release, [], ProbeRun())

    def check_serving(self, release: str | None, checked: list[Stage] | None = None, *,
                      label: str = "probe") -> ProbeResult:
        """The stages that need the server as it runs now (startup, generation), after ``checked`` (the stages of
        :meth:`check_release`; when one of them failed these are not run). A caller that restarts the server between
        the two has its crash clock start at the real start."""
        ctx = ProbeRun(prefetch=True)
        stages = self._stages([m for m in STAGE_MODULES if m.NEEDS_SERVER], release, list(checked or []), ctx)
        result = ProbeResult(self.host.name, release, stages, label)
        if ctx.info is not None:
            result.ddtree = ddtree_summary(ctx.info, ctx.info_after, ctx.replies)
        return result

    def run(self, release: str | None, *, label: str = "probe") -> ProbeResult:
        """Every stage in order against the server as it runs, stopping at the first failure."""
        return self.check_serving(release, self.check_release(release), label=label)

    def _stages(self, modules: list[ModuleType], release: str | None, stages: list[Stage], ctx: ProbeRun) -> list[Stage]:
        for module in modules:
            name = module.NAME
            if any(s.status == "fail" for s in stages):
                stages.append(Stage(name, "not-run", 0.0, "an earlier stage failed"))
                continue
            self.progress(f"{self.host.name}: probe stage {name}")
            with self._waiting(f"{self.host.name}: probe stage {name}"):
                stage = module.run(self, release, ctx)
            stage.seconds = round(stage.seconds, 3)
            stages.append(stage)
            if stage.status == "fail" and not stage.log_tail and name in _WITH_LOG:
                stage.log_tail = self.log_tail()
        return stages

    def _waiting(self, label: str) -> AbstractContextManager[Any]:
        """The stage as a visible wait when the progress callback offers one (commands/_writes.py: elapsed time and
        the server log's last line, read over a second channel of this connection), else nothing."""
        waiting = getattr(self.progress, "waiting", None)
        return waiting(label, detail=lambda: self.log_tail(1)) if waiting else nullcontext()

    def log_tail(self, lines: int = 40) -> str:
        """The server log's last lines, for a failed stage (empty when they cannot be read)."""
        try:
            return ServerControl(self.conn, self.fence).logs(lines)["text"]
        except DeployError:
            return ""
