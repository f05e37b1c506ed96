"""What a probe gives (``Stage``, ``ProbeResult``) and what one probe run carries from stage to stage (``ProbeRun``),
with what a stage needs of the prober that runs it (``Probing``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

from ..inventory import Host


@dataclass
class Stage:
    name: str
    status: str  # pass | fail | skip | not-run
    seconds: float = 0.0
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""


@dataclass
class ProbeResult:
    host: str
    release: str | None
    stages: list[Stage]
    label: str = "probe"
    ddtree: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(s.status in ("pass", "skip") for s in self.stages) and any(s.status == "pass" for s in self.stages)

    @property
    def failed_stage(self) -> Stage | None:
        return next((s for s in self.stages if s.status == "fail"), None)

    @property
    def seconds(self) -> float:
        return round(sum(s.seconds for s in self.stages), 3)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "label": self.label, "release": self.release, "ok": self.ok, "seconds": self.seconds,
                "stages": [asdict(s) for s in self.stages], "ddtree": self.ddtree}


@dataclass
class ProbeRun:
    """What the stages of one probe hand each other: the overlay stage tells the self-test whether a runtime is there
    and what GPU the host has; the start-up stage (``prefetch``: it also runs the generation on the host in its
    round trip) hands the generation stage its result, and the server's info before and after, which with the
    generation's replies make the DDTree summary of the result."""

    prefetch: bool = False
    runtime_present: bool = False
    gpu_info: dict[str, Any] | None = None
    generation: dict[str, Any] | None = None  # the generation run on the host right after start-up (prefetch)
    info: dict[str, Any] | None = None  # SGLang's /get_server_info before the probe's requests
    info_after: dict[str, Any] | None = None  # ... and after them
    replies: list[dict[str, Any]] | None = None  # the generation stage's replies


class Probing(Protocol):
    """What a stage uses of the prober running it (``prober.Prober``)."""

    conn: Any
    host: Host
    facts: dict[str, Any] | None
    progress: Callable[[str], None]

    def call(self, op: str, timeout: float, **args: Any) -> Any: ...

    def log_tail(self, lines: int = 40) -> str: ...
