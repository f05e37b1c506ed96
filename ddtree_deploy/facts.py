"""Host facts: what decides whether compiled files and a patch set fit a host, read in one remote round trip.

``gather(host)`` runs ``ddtree_deploy/remote/facts.py`` under the host's own Python and returns one JSON-able dict:

- ``python``: version, implementation, ``abi_tag`` (``cp311``), ``soabi``, platform and machine; ``glibc``.
- ``torch``: ``status`` (``ok`` | ``missing`` | ``broken`` | ``timeout``), ``version`` with its local label,
  ``release`` (``2.11.0``) and ``local`` (``cu130``) split apart, ``cuda`` (``torch.version.cuda``), ``cxx11_abi``,
  ``arch_list`` (``sm_90``, ``compute_90``...). torch is imported in a subprocess with a timeout on the host, so a
  broken torch is a fact, not a hang; the result is cached on the host by the identity of torch's files.
- ``gpu``: ``status`` (``ok`` | ``absent`` | ``error``), ``driver``, ``cuda_max`` (the highest CUDA the driver
  supports, from nvidia-smi), ``gpus`` with ``name`` and ``compute_cap``. A host without GPUs is ``absent``.
- ``packages``: for sglang, sglang-kernel, sgl-kernel, flashinfer(-python/-cubin), triton, transformers, torch:
  ``version``, ``requires`` (its METADATA Requires-Dist lines on tracked packages, as the host has them),
  ``requires_torch`` (its pin on torch) and ``pins`` (its pins on the other tracked packages), the last two parsed
  here with ``packaging.requirements`` and only those whose environment marker holds on the host (no extras);
  ``None`` when not installed.
- ``sglang``: the dist-info directory, wheel tags, ``root_is_purelib`` and ``compiled``: every ``.so`` inside the
  package with its ``needed`` libraries, ``links_libtorch`` and the newest ``glibc_max`` symbol version it needs.

Facts are kept with every snapshot (in the store: ``ddtree_deploy.snapshot.store``) and are what ``ddtree_deploy.abi``
reasons over. ``schema`` versions the record; ``host`` and ``collected_at`` are added here, locally.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from .inventory import Host
from .transport import HostConnection

FACTS_SCHEMA = 1
#: Seconds the host may spend importing torch before the probe is killed and torch reported as ``timeout``.
TORCH_TIMEOUT = 90.0


def gather(host: Host, conn: HostConnection | None = None, *, refresh: bool = False,
           package: str = "sglang") -> dict[str, Any]:
    """Facts of ``host`` (one round trip). ``refresh`` ignores the host-side torch cache."""
    if conn is None:
        with HostConnection(host) as own:
            return gather(host, own, refresh=refresh, package=package)
    raw = conn.call("facts", "facts", site_packages=host.site_packages, package=package,
                    release_root=host.release_root, torch_timeout=TORCH_TIMEOUT, refresh=refresh,
                    timeout=TORCH_TIMEOUT + 60)
    return finish(raw, host.name)


def finish(raw: dict[str, Any], host_name: str) -> dict[str, Any]:
    """Stamp a raw facts record from the host with our schema version, the host name and the time."""
    record = {"schema": FACTS_SCHEMA, "host": host_name,
              "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    record.update(raw)
    for info in (record.get("packages") or {}).values():
        if isinstance(info, dict) and isinstance(info.get("requires"), list):
            info["pins"] = pins(info["requires"], record.get("python") or {}, host_name)
            info["requires_torch"] = info["pins"].get("torch")
    return record


def marker_environment(python: dict[str, Any]) -> dict[str, str]:
    """PEP 508 marker variables of the host, from its python facts (what is not recorded is this machine's)."""
    env = dict(default_environment())
    version = str(python.get("version") or "")
    if version:
        env["python_full_version"] = version
        env["python_version"] = ".".join(version.split(".")[:2])
    if python.get("machine"):
        env["platform_machine"] = str(python["machine"])
    if python.get("implementation"):
        env["implementation_name"] = str(python["implementation"])
    platform = str(python.get("platform") or "")
    if platform.startswith("linux"):
        env["sys_platform"], env["platform_system"] = "linux", "Linux"
    return env


def pins(requires: list[str], python: dict[str, Any], host_name: str = "") -> dict[str, str]:
    """Tracked package -> version specifier, from Requires-Dist lines: a requirement under an extra, or whose
    marker is false on the host (another Python, another machine), pins nothing there."""
    env = marker_environment(python)
    out: dict[str, str] = {}
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            logging.getLogger("ddtree_deploy.facts").debug("%s: unreadable Requires-Dist %r: %s", host_name, line, exc)
            continue
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        out[canonicalize_name(req.name)] = str(req.specifier)
    return out


# -- accessors used by abi and the CLI (tolerant of missing sections: facts may come from older records) -----------
def get(facts: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``get(f, "torch.local")``: walk a dotted path, returning ``default`` where any part is missing."""
    node: Any = facts
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node or node[part] is None:
            return default
        node = node[part]
    return node


def kernel_package(facts: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The installed SGLang kernel distribution: ``sglang-kernel`` (new name) or ``sgl-kernel`` (old name)."""
    for name in ("sglang-kernel", "sgl-kernel"):
        info = get(facts, f"packages.{name}")
        if info:
            return name, info
    return None


def flashinfer_package(facts: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for name in ("flashinfer-python", "flashinfer"):
        info = get(facts, f"packages.{name}")
        if info:
            return name, info
    return None


def compute_caps(facts: dict[str, Any]) -> list[str]:
    """Distinct compute capabilities of the host's GPUs, e.g. ``["9.0"]``."""
    caps = [g.get("compute_cap") for g in get(facts, "gpu.gpus", []) if g.get("compute_cap")]
    return sorted(set(caps))


def binary_fingerprint(facts: dict[str, Any]) -> dict[str, Any]:
    """The facts two hosts must share for a compiled file built on one to load on the other."""
    return {
        "machine": get(facts, "python.machine"),
        "python_abi": get(facts, "python.abi_tag"),
        "glibc": get(facts, "glibc"),
        "torch_release": get(facts, "torch.release"),
        "torch_local": get(facts, "torch.local"),
        "torch_cuda": get(facts, "torch.cuda"),
        "cxx11_abi": get(facts, "torch.cxx11_abi"),
    }


def flatten(facts: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values (lists kept whole), for diffs and JSON-friendly comparisons."""
    flat: dict[str, Any] = {}
    for key, value in facts.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


#: Keys that change on every collection and say nothing about the host.
VOLATILE = ("collected_at", "seconds", "torch.seconds", "torch.cached")
