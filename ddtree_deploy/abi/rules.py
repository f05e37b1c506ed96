"""The ABI rules: each one small function over ``ddtree_deploy.facts`` records that returns ``Finding``s, and the
entry points that run them for a host, a set of hosts, or an overlay bound for a host. Nothing here talks to a host.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..facts import binary_fingerprint, compute_caps, get, kernel_package
from .findings import ERROR, INFO, WARNING, Finding, sort_findings
from .stacks import STACK_RULES

#: Lowest driver branch for each CUDA major (NVIDIA minor-version compatibility table).
DRIVER_MINIMUM = {13: 580, 12: 525, 11: 450}

#: Distributions compiled against a specific torch build: a torch pin that the host does not meet is an error.
COMPILED_AGAINST_TORCH = ("sglang-kernel", "sgl-kernel")


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _major_minor(text: str | None) -> tuple[int, int] | None:
    """``"13.0"`` -> (13, 0); ``"580.95.05"`` -> (580, 95)."""
    if not text:
        return None
    parts = str(text).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    except ValueError:
        return None


def _arch_entries(arch_list: Iterable[str]) -> list[tuple[str, int, int, str]]:
    """``sm_90a`` -> ("sm", 9, 0, "a"); ``compute_120`` -> ("compute", 12, 0, "")."""
    parsed = []
    for arch in arch_list:
        kind, _, rest = arch.partition("_")
        digits = "".join(ch for ch in rest if ch.isdigit())
        suffix = rest[len(digits):]
        if kind not in ("sm", "compute") or len(digits) < 2:
            continue
        parsed.append((kind, int(digits[:-1]), int(digits[-1]), suffix))
    return parsed


def arch_runs_on(arch_list: Iterable[str], cap: str) -> str | None:
    """How a GPU of compute capability ``cap`` gets kernels from ``arch_list``: "sass", "ptx", or None.

    SASS for sm_XY runs on devices of the same major with minor >= Y (arch-specific ``a`` builds only on exactly
    X.Y); PTX (compute_XY) is JIT-compiled for any device of capability >= X.Y.
    """
    dev = _major_minor(cap)
    if dev is None:
        return None
    entries = _arch_entries(arch_list)
    for kind, major, minor, suffix in entries:
        if kind == "sm" and major == dev[0] and (minor == dev[1] if suffix == "a" else minor <= dev[1]):
            return "sass"
    for kind, major, minor, _suffix in entries:
        if kind == "compute" and (major, minor) <= dev:
            return "ptx"
    return None


# -- per-host rules ---------------------------------------------------------------------------------------------------
def rule_torch_importable(host: str, facts: dict[str, Any]) -> list[Finding]:
    """torch must import in the host's interpreter; a broken or hanging torch breaks SGLang before any kernel runs."""
    status = get(facts, "torch.status")
    if status in ("broken", "timeout"):
        return [Finding(ERROR, host, "torch-importable", f"torch does not import ({status}): {get(facts, 'torch.error', '')}",
                        "SGLang imports torch first; the server cannot start",
                        f"repair torch in {get(facts, 'python.executable', 'the host Python')} (reinstall the wheel that "
                        "matches the driver), then take a new snapshot")]
    if status == "missing":
        return [Finding(WARNING, host, "torch-importable", "torch is not installed for the host's Python",
                        "SGLang needs torch to serve; only packaging-level checks are possible",
                        "install the torch build SGLang pins (with the CUDA tag the driver supports)")]
    return []


def rule_driver_supports_cuda(host: str, facts: dict[str, Any]) -> list[Finding]:
    """The driver must be new enough for torch's CUDA runtime (CUDA 13 >= 580, 12 >= 525, 11 >= 450)."""
    cuda = _major_minor(get(facts, "torch.cuda"))
    if cuda is None:
        return []
    gpu_status = get(facts, "gpu.status")
    if gpu_status != "ok":
        severity = WARNING if gpu_status == "absent" else ERROR
        return [Finding(severity, host, "driver-cuda",
                        f"torch {get(facts, 'torch.version')} uses CUDA {get(facts, 'torch.cuda')} but the host has no "
                        f"working NVIDIA driver ({get(facts, 'gpu.error', gpu_status)})",
                        "CUDA kernels cannot run without a driver: every CUDA call fails",
                        "install the NVIDIA driver (>= %s for CUDA %d), or deploy a CPU-only setup here"
                        % (DRIVER_MINIMUM.get(cuda[0], "?"), cuda[0]))]
    driver = _major_minor(get(facts, "gpu.driver"))
    minimum = DRIVER_MINIMUM.get(cuda[0])
    if driver is not None and minimum is not None and driver[0] < minimum:
        return [Finding(ERROR, host, "driver-cuda",
                        f"driver {get(facts, 'gpu.driver')} is older than CUDA {cuda[0]}.x needs (>= {minimum}); "
                        f"torch is {get(facts, 'torch.version')}",
                        "\"CUDA driver version is insufficient for CUDA runtime version\" at the first CUDA call",
                        f"upgrade the driver to >= {minimum}, or install the torch build for the CUDA the driver "
                        f"supports (driver reports CUDA {get(facts, 'gpu.cuda_max', '?')})")]
    cuda_max = _major_minor(get(facts, "gpu.cuda_max"))
    if cuda_max is not None and cuda_max[0] < cuda[0]:
        return [Finding(ERROR, host, "driver-cuda",
                        f"driver supports CUDA <= {get(facts, 'gpu.cuda_max')}, torch needs CUDA {get(facts, 'torch.cuda')}",
                        "a CUDA runtime of a newer major than the driver fails at initialisation",
                        f"install the torch build for CUDA {cuda_max[0]}.x (e.g. +cu{cuda_max[0]}{cuda_max[1]}) or upgrade the driver")]
    if cuda_max is not None and cuda_max < cuda:
        return [Finding(WARNING, host, "driver-cuda",
                        f"driver reports CUDA {get(facts, 'gpu.cuda_max')}, torch was built with {get(facts, 'torch.cuda')}",
                        "minor-version compatibility runs it, but PTX compiled by the newer toolkit cannot be JIT-loaded",
                        "upgrade the driver to one that reports CUDA >= the torch build")]
    return []


def rule_gpu_arch_in_arch_list(host: str, facts: dict[str, Any]) -> list[Finding]:
    """Every GPU's compute capability must be covered by torch's arch list (SASS of the same major, or older PTX)."""
    caps = compute_caps(facts)
    if not caps:
        return []
    if get(facts, "torch.status") != "ok":
        return []
    arch_list = get(facts, "torch.arch_list", [])
    if not get(facts, "torch.cuda"):
        return [Finding(ERROR, host, "gpu-arch",
                        f"the host has GPUs ({', '.join(caps)}) but torch {get(facts, 'torch.version')} is a CPU build",
                        "no CUDA kernels at all: SGLang cannot use the GPUs",
                        "install the CUDA build of torch that SGLang pins (e.g. +cu128 or +cu130, per the driver)")]
    if not arch_list:
        return [Finding(WARNING, host, "gpu-arch", "torch's arch list is unknown (empty)",
                        "cannot tell whether the GPUs have kernels", "re-take the facts with a working torch import")]
    out = []
    for cap in caps:
        how = arch_runs_on(arch_list, cap)
        if how is None:
            out.append(Finding(ERROR, host, "gpu-arch",
                               f"GPU compute capability {cap} (sm_{cap.replace('.', '')}) is not in torch's arch list "
                               f"({' '.join(arch_list)})",
                               "\"no kernel image is available for execution on the device\" at the first kernel",
                               "install a torch build whose arch list covers this GPU (CUDA 13 dropped sm_70 and older; "
                               "sm_120 needs CUDA >= 12.8)"))
        elif how == "ptx":
            out.append(Finding(WARNING, host, "gpu-arch",
                               f"GPU {cap} runs torch only through PTX JIT (no sm_{cap.replace('.', '')} SASS)",
                               "the first launch of every kernel JIT-compiles; slow start, and fragile with old drivers",
                               "prefer a torch build with SASS for this GPU"))
    return out


def _libtorch_linked(facts: dict[str, Any], name: str) -> list[str]:
    """The compiled files of ``name`` (sglang only: the package the facts walk) that link libtorch / libc10."""
    if name != "sglang":
        return []
    return [c.get("path", "?") for c in (get(facts, "sglang.compiled", []) or []) if c.get("links_libtorch")]


def rule_torch_pins(host: str, facts: dict[str, Any]) -> list[Finding]:
    """Packages that pin torch must see the torch they pin; kernel packages built against another torch do not load."""
    torch_version = _version(get(facts, "torch.version"))
    if torch_version is None:
        return []
    out = []
    for name, info in sorted((get(facts, "packages", {}) or {}).items()):
        if not info or name == "torch" or not info.get("requires_torch"):
            continue
        spec_text = info["requires_torch"].split(";")[0].strip()
        try:
            spec = SpecifierSet(spec_text)
        except InvalidSpecifier:
            continue
        if spec.contains(torch_version, prereleases=True):
            continue
        compiled = name in COMPILED_AGAINST_TORCH
        linked = _libtorch_linked(facts, name)  # named in the warning: seen failing on torch 2.11 only (the H200 here)
        if linked:
            why = (f"{len(linked)} compiled file(s) in it link libtorch and were built for that torch ({linked[0]}"
                   f"{', ...' if len(linked) > 1 else ''}); SGLang 0.5.19+'s Rust TreeCore built for torch 2.13 "
                   "panics in the radix cache on torch 2.11 (`Rust TreeCore panicked: ... UnknownKind(32)`; "
                   "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python selects SGLang's Python TreeCore instead)")
        elif compiled:
            why = "its compiled ops were built against that torch: import fails with `undefined symbol: _ZN3c10...`"
        else:
            why = "pip sees a broken dependency set; APIs SGLang expects from torch may be missing"
        out.append(Finding(
            ERROR if compiled else WARNING, host, "torch-pins",
            f"{name} {info.get('version')} pins torch{spec_text}, the host has torch {torch_version}",
            why,
            (f"install torch{spec_text} (with the CUDA tag the driver supports) or the {name} build for torch "
             f"{torch_version.public}" if compiled else
             f"install torch{spec_text} (with the CUDA tag the driver supports) or a {name} release made for torch "
             f"{torch_version.public}")))
    return out


def rule_compiled_glibc(host: str, facts: dict[str, Any]) -> list[Finding]:
    """Compiled files inside the package must not need a newer glibc than the host has."""
    glibc = _major_minor(get(facts, "glibc"))
    if glibc is None:
        return []
    out = []
    for so in get(facts, "sglang.compiled", []) or []:
        need = _major_minor(so.get("glibc_max"))
        if need is not None and need > glibc:
            out.append(Finding(ERROR, host, "compiled-glibc",
                               f"{so['path']} needs GLIBC_{so['glibc_max']}, the host has glibc {get(facts, 'glibc')}",
                               "the loader refuses it: `version GLIBC_x.y not found`",
                               "install the sglang wheel built for this host's glibc (manylinux tag) instead of copying files"))
    return out


HOST_RULES: tuple[Callable[[str, dict[str, Any]], list[Finding]], ...] = (
    rule_torch_importable, rule_driver_supports_cuda, rule_gpu_arch_in_arch_list, rule_torch_pins, rule_compiled_glibc,
    *STACK_RULES,
)


# -- overlay rules ----------------------------------------------------------------------------------------------------
def rule_compiled_files_built_elsewhere(host: str, facts: dict[str, Any], built_from_facts: dict[str, Any] | None,
                                        carries_compiled: bool) -> list[Finding]:
    """Compiled files may only go to a host with the build host's torch release, CUDA tag, C++ ABI, Python ABI, glibc."""
    if not carries_compiled or built_from_facts is None:
        return []
    src, dst = binary_fingerprint(built_from_facts), binary_fingerprint(facts)
    origin = built_from_facts.get("host", "the build host")
    out = []
    labels = {
        "machine": ("CPU architecture", "the machine code is for another CPU"),
        "python_abi": ("Python ABI", "extension modules are built for one CPython ABI (cpXY) and do not import in another"),
        "torch_release": ("torch release", "libtorch's C++ symbols change between releases: `undefined symbol: _ZN3c10...`"),
        "torch_local": ("torch CUDA tag", "+cu128 and +cu130 builds of one release export different symbols and link "
                        "different CUDA runtimes; `==2.11.0` matches both, so pip cannot see it"),
        "torch_cuda": ("torch.version.cuda", "kernels built for one CUDA runtime do not load on another"),
        "cxx11_abi": ("C++11 ABI", "std::string symbols differ between ABIs: `undefined symbol ...Ss...`"),
    }
    for key, (label, why) in labels.items():
        if src.get(key) != dst.get(key):
            out.append(Finding(ERROR, host, "overlay-compiled",
                               f"overlay carries compiled files built on {origin} with {label} {src.get(key)}; "
                               f"this host has {dst.get(key)}", why,
                               "rebuild the overlay from this host's own snapshot (patch sets re-apply per host), "
                               "or drop the compiled files from it"))
    sg, dg = _major_minor(src.get("glibc")), _major_minor(dst.get("glibc"))
    if sg and dg and dg < sg:
        out.append(Finding(ERROR, host, "overlay-compiled",
                           f"overlay carries compiled files built on {origin} with glibc {src.get('glibc')}; this host has "
                           f"{dst.get('glibc')}",
                           "files linked against a newer glibc fail to load: `version GLIBC_x.y not found`",
                           "rebuild the overlay from this host's own snapshot"))
    elif sg and dg and dg > sg:
        out.append(Finding(WARNING, host, "overlay-compiled",
                           f"compiled files were built on glibc {src.get('glibc')}, this host has {dst.get('glibc')}",
                           "glibc is backward compatible, so they load; other system libraries may still differ",
                           "prefer an overlay built from this host's own snapshot"))
    return out


def rule_requirements(host: str, facts: dict[str, Any], requires: dict[str, str]) -> list[Finding]:
    """Patch-set requirements (PEP 440 specifiers) against the host; local labels compared explicitly."""
    out = []
    for name, spec_text in sorted(requires.items()):
        installed = _requirement_subject(facts, name)
        try:
            spec = SpecifierSet(spec_text)
        except InvalidSpecifier:
            out.append(Finding(ERROR, host, "requirements", f"requirement {name} {spec_text!r} is not a valid specifier",
                               "it cannot be checked", "fix the patch set's requirements (PEP 440, e.g. '>=2.11,<2.12')"))
            continue
        if installed is None:
            out.append(Finding(ERROR, host, "requirements", f"the patch set needs {name}{spec_text}; not installed on the host",
                               "the patched code imports it", f"install {name}{spec_text}"))
            continue
        version = _version(installed)
        if version is None:
            out.append(Finding(ERROR, host, "requirements", f"{name} version {installed!r} is not a PEP 440 version",
                               "it cannot be compared", f"check {name} on the host"))
            continue
        wanted_locals = {s.version.split("+", 1)[1] for s in spec if "+" in s.version}
        if wanted_locals and (version.local or "") not in wanted_locals:
            out.append(Finding(ERROR, host, "requirements",
                               f"the patch set needs {name}{spec_text}; the host has {installed} (build +{version.local or 'none'})",
                               "same release, different build: compiled code for one CUDA tag does not run on the other",
                               f"install the +{sorted(wanted_locals)[0]} build of {name} or use the patch set for this build"))
            continue
        if not spec.contains(version, prereleases=True):
            out.append(Finding(ERROR, host, "requirements", f"the patch set needs {name}{spec_text}; the host has {installed}",
                               "the patch set was written and tested against those versions; its code calls their APIs",
                               f"install {name}{spec_text}, or pick the patch set made for {name} {version.public}"))
    return out


def rule_base_version(host: str, facts: dict[str, Any], base_version: str | None) -> list[Finding]:
    """The patch set's base must be exactly the SGLang installed on the host."""
    if not base_version:
        return []
    installed = get(facts, "packages.sglang.version") or get(facts, "sglang.version")
    if installed == base_version:
        return []
    return [Finding(ERROR, host, "base-version", f"patch set is for sglang {base_version}; the host has sglang {installed}",
                    "patches are tied to the exact files of their base; another release has other code at those lines",
                    f"use the patch set for sglang {installed}, or install sglang {base_version} on the host")]


def _requirement_subject(facts: dict[str, Any], name: str) -> str | None:
    key = name.lower().replace("_", "-")
    if key == "python":
        return get(facts, "python.version")
    if key == "torch":
        return get(facts, "torch.version") or get(facts, "packages.torch.version")
    if key == "cuda":
        return get(facts, "torch.cuda")
    if key == "glibc":
        return get(facts, "glibc")
    if key in ("sglang-kernel", "sgl-kernel"):
        found = kernel_package(facts)
        return found[1].get("version") if found else None
    return get(facts, f"packages.{key}.version")


# -- entry points -----------------------------------------------------------------------------------------------------
def check_host(host: str, facts: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    for rule in HOST_RULES:
        out.extend(rule(host, facts))
    if get(facts, "gpu.status") == "absent":
        out.append(Finding(INFO, host, "no-gpu", "no NVIDIA GPU or driver on this host",
                           "driver and arch rules do not apply; CUDA kernels cannot run here", "none needed for CPU-only use"))
    return out


def rule_shared_binaries(facts_by_host: dict[str, dict[str, Any]]) -> list[Finding]:
    """Which hosts could share compiled files: a warning for each host whose binary fingerprint differs."""
    if len(facts_by_host) < 2:
        return []
    names = list(facts_by_host)
    ref = names[0]
    ref_fp = binary_fingerprint(facts_by_host[ref])
    out = []
    for name in names[1:]:
        fp = binary_fingerprint(facts_by_host[name])
        diffs = [f"{k} {ref_fp[k]} vs {fp[k]}" for k in fp if fp[k] != ref_fp[k]]
        if diffs:
            out.append(Finding(WARNING, name, "shared-binaries", f"differs from {ref}: {'; '.join(diffs)}",
                               f"compiled files (extensions, kernels) built on {ref} will not load here, nor the reverse",
                               "build each host's overlay from its own snapshot; never copy .so files between them"))
    versions = {n: get(f, "packages.sglang.version") for n, f in facts_by_host.items()}
    if len(set(versions.values())) > 1:
        out.append(Finding(INFO, ", ".join(names), "sglang-versions",
                           "hosts run different sglang: " + ", ".join(f"{n} {v}" for n, v in versions.items()),
                           "a patch set targets one base version", "deploy the patch set made for each base"))
    return out


def check_hosts(facts_by_host: dict[str, dict[str, Any]]) -> list[Finding]:
    """Every per-host rule for every host, plus whether they could share compiled files."""
    out: list[Finding] = []
    for host, facts in facts_by_host.items():
        out.extend(check_host(host, facts))
    out.extend(rule_shared_binaries(facts_by_host))
    return sort_findings(out)


def check_overlay(host: str, facts: dict[str, Any], *, built_from_facts: dict[str, Any] | None, carries_compiled: bool,
                  requires: dict[str, str], base_version: str) -> list[Finding]:
    """May an overlay go to ``host``? Errors here make ``deploy apply`` refuse to push (exit 4)."""
    out = check_host(host, facts)
    out.extend(rule_compiled_files_built_elsewhere(host, facts, built_from_facts, carries_compiled))
    out.extend(rule_requirements(host, facts, requires))
    out.extend(rule_base_version(host, facts, base_version))
    return sort_findings(out)
