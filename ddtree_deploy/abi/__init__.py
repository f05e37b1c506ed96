"""ABI rules over host facts: can these compiled files, this torch build and this patch set run on that host?

pip cannot answer it: ``torch==2.11.0`` matches ``2.11.0+cu130`` and ``2.11.0+cu128`` alike (PEP 440 ignores local
labels unless the specifier names one), yet an extension built against one fails on the other with
``undefined symbol``, a CUDA 13 runtime fails on a 570 driver, and a GPU whose arch is missing from torch's arch list
fails with ``no kernel image is available``. Each rule below is one small function over ``ddtree_deploy.facts``
records that returns ``Finding``s; nothing here talks to a host. The package, by job: ``findings`` (the verdict
type), ``rules`` (the rules and the checks that run them), ``stacks`` (one row per SGLang release, read from its
patch-set folder: the torch, sglang-kernel, flashinfer and Python it needs, and the rules that read it), ``render``
(the matrix and findings tables).

Public API:

- ``check_hosts(facts_by_host) -> list[Finding]``: every per-host rule, plus which hosts could share compiled files.
- ``check_overlay(host, facts, *, built_from_facts, carries_compiled, requires, base_version) -> list[Finding]``:
  may an overlay built from ``built_from_facts`` (``None``: built from this host's own snapshot) be pushed to
  ``host``? ``requires`` maps ``python``, ``torch``, ``triton``, ``cuda``, ``glibc`` or any distribution name to a
  PEP 440 specifier set (``{"torch": ">=2.11,<2.12"}``); a specifier with a local label (``==2.11.0+cu130``) has the
  label compared explicitly. ``deploy apply`` refuses to push when ``has_errors`` (exit 4).
- ``Finding(severity, host, rule, what, why, fix)`` with severity ``error`` | ``warning`` | ``info``;
  ``has_errors(findings)``; ``render(findings)`` and ``matrix(facts_by_host)`` (rich tables), ``matrix_rows``
  (the same matrix as data, for ``--json``).
"""

from __future__ import annotations

from .findings import ERROR, INFO, WARNING, Finding, has_errors, sort_findings
from .render import matrix, matrix_rows, render
from .stacks import Stack, stack_table, rule_companion_pins, rule_cuda_major, rule_kernel_torch, rule_python_floor
from .rules import (
    COMPILED_AGAINST_TORCH,
    DRIVER_MINIMUM,
    HOST_RULES,
    arch_runs_on,
    check_host,
    check_hosts,
    check_overlay,
    rule_base_version,
    rule_compiled_files_built_elsewhere,
    rule_compiled_glibc,
    rule_driver_supports_cuda,
    rule_gpu_arch_in_arch_list,
    rule_requirements,
    rule_shared_binaries,
    rule_torch_importable,
    rule_torch_pins,
)

__all__ = [
    "COMPILED_AGAINST_TORCH", "DRIVER_MINIMUM", "ERROR", "HOST_RULES", "INFO", "WARNING", "Finding", "arch_runs_on",
    "check_host", "check_hosts", "check_overlay", "has_errors", "matrix", "matrix_rows", "render",
    "rule_base_version", "rule_compiled_files_built_elsewhere", "rule_compiled_glibc", "rule_driver_supports_cuda",
    "rule_gpu_arch_in_arch_list", "rule_requirements", "rule_shared_binaries", "rule_torch_importable",
    "rule_torch_pins", "sort_findings", "Stack", "stack_table", "rule_companion_pins", "rule_cuda_major",
    "rule_kernel_torch", "rule_python_floor",
]
