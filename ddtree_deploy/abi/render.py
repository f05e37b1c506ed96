"""The ABI stage as tables: the compatibility matrix (facts down, hosts across) and the findings, for the CLI."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from rich.markup import escape

from ..console import FitTable, table
from ..facts import compute_caps, flashinfer_package, get, kernel_package
from .findings import ERROR, INFO, WARNING, Finding, sort_findings


_MATRIX: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("python ABI", lambda f: f"{get(f, 'python.abi_tag')} ({get(f, 'python.version')})"),
    ("glibc", lambda f: get(f, "glibc")),
    ("machine", lambda f: get(f, "python.machine")),
    ("torch release", lambda f: get(f, "torch.release")),
    ("torch CUDA tag", lambda f: get(f, "torch.local")),
    ("torch.version.cuda", lambda f: get(f, "torch.cuda")),
    ("CXX11 ABI", lambda f: get(f, "torch.cxx11_abi")),
    ("arch list", lambda f: " ".join(get(f, "torch.arch_list", [])) or None),
    ("driver", lambda f: get(f, "gpu.driver") or get(f, "gpu.status")),
    ("driver max CUDA", lambda f: get(f, "gpu.cuda_max")),
    ("GPU compute caps", lambda f: ", ".join(compute_caps(f)) or None),
    ("GPUs", lambda f: ", ".join(sorted({g.get("name", "?") for g in get(f, "gpu.gpus", [])})) or None),
    ("sglang", lambda f: get(f, "packages.sglang.version")),
    ("sglang pins torch", lambda f: get(f, "packages.sglang.requires_torch")),
    ("sglang-kernel", lambda f: _named_version(kernel_package(f))),
    ("kernel pins torch", lambda f: (kernel_package(f) or ("", {}))[1].get("requires_torch")),
    ("flashinfer", lambda f: _named_version(flashinfer_package(f))),
    ("flashinfer pins torch", lambda f: (flashinfer_package(f) or ("", {}))[1].get("requires_torch")),
    ("triton", lambda f: get(f, "packages.triton.version")),
    ("transformers", lambda f: get(f, "packages.transformers.version")),
    ("compiled .so in sglang", lambda f: len(get(f, "sglang.compiled", []) or [])),
)


def _named_version(found: tuple[str, dict[str, Any]] | None) -> str | None:
    return f"{found[1].get('version')} ({found[0]})" if found else None


def matrix_rows(facts_by_host: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The compatibility matrix as data: one row per fact, a value per host, and whether hosts differ."""
    rows = []
    for label, read in _MATRIX:
        values = {host: read(f) for host, f in facts_by_host.items()}
        rows.append({"fact": label, "values": values, "differs": len({str(v) for v in values.values()}) > 1})
    return rows


def matrix(facts_by_host: dict[str, dict[str, Any]]) -> FitTable:
    """Facts down, hosts across; rows where hosts differ are highlighted (console.table's layout rule)."""
    t = table("binary compatibility", ["fact", *facts_by_host], [])
    for row in matrix_rows(facts_by_host):
        style = "yellow" if row["differs"] else None
        t.add_row(row["fact"], *[escape("-" if v is None else str(v)) for v in row["values"].values()], style=style)
    return t


def render(findings: Iterable[Finding]) -> FitTable:
    """The findings, errors first (console.table's layout rule: a fix's version is never cut)."""
    colors = {ERROR: "bold red", WARNING: "yellow", INFO: "dim"}
    t = table("ABI findings", ("severity", "host", "rule", "what", "why it breaks", "fix"), [], show_lines=True)
    for f in sort_findings(findings):
        t.add_row(f"[{colors.get(f.severity, '')}]{f.severity}[/]", escape(f.host), f.rule, escape(f.what),
                  escape(f.why), escape(f.fix))
    return t
