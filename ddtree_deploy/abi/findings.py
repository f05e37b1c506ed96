"""An ABI verdict: one ``Finding`` (how bad, on which host, which rule, what differs, why it breaks, how to fix)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

ERROR, WARNING, INFO = "error", "warning", "info"
_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One verdict: how bad, on which host, which rule, what differs, why it breaks, how to fix it."""

    severity: str
    host: str
    rule: str
    what: str
    why: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == ERROR for f in findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (_ORDER.get(f.severity, 9), f.host, f.rule))


# -- small parsers ----------------------------------------------------------------------------------------------------
