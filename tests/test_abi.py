"""ABI rules, one table per rule, over recorded fact records (tests/fixtures/facts/*.json).

The fixtures are the real record ``ddtree_deploy.facts.gather`` produced on the sandbox host (``sandbox-base-real``,
``no-gpu``) and copies of it edited to stand for the eval hosts (``_provenance`` in each file says what was edited):
a cu130 host with driver 580 and an H200, a cu128 host with driver 570, and a host whose sgl-kernel pins another
torch. Each rule must fire on the case built for it and stay silent on a compatible one.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from cli_inproc import run_cli

from ddtree_deploy import abi

FIXTURES = Path(__file__).parent / "fixtures" / "facts"
REPO = Path(__file__).resolve().parent.parent


def fx(name: str, **edits: Any) -> dict[str, Any]:
    """A fixture, with dotted-path edits applied (``torch__cuda="13.0"`` sets facts["torch"]["cuda"])."""
    facts = json.loads((FIXTURES / f"{name}.json").read_text())
    for dotted, value in edits.items():
        node = facts
        parts = dotted.split("__")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = copy.deepcopy(value)
    return facts


def pairs(findings: list[abi.Finding]) -> list[tuple[str, str]]:
    """What a rule said, as (rule, severity): a finding filed under the wrong rule fails as surely as a wrong severity."""
    return [(f.rule, f.severity) for f in findings]


def test_fixtures_are_real_fact_records() -> None:
    """Every fixture has the structure the facts module produces (same keys as the unedited real record)."""
    real = json.loads((FIXTURES / "sandbox-base-real.json").read_text())
    for path in FIXTURES.glob("*.json"):
        data = json.loads(path.read_text())
        assert set(real) <= set(data), path.name
        for section in ("python", "torch", "gpu", "sglang"):
            assert set(real[section]) - {"git_version", "seconds"} <= set(data[section]), (path.name, section)
        assert data["_provenance"]


CU130, CU128, NOGPU, PINS = "cu130-h200-driver580", "cu128-driver570", "no-gpu", "kernel-pins-other-torch"

# (case id, rule, facts, expected (rule, severity) of its findings — [] means silent)
HOST_CASES: list[tuple[str, Callable[[str, dict[str, Any]], list[abi.Finding]], dict[str, Any], list[tuple[str, str]]]] = [
    # driver vs CUDA runtime
    ("driver: cu130 on driver 580 is fine", abi.rule_driver_supports_cuda, fx(CU130), []),
    ("driver: cu128 on driver 570 is fine", abi.rule_driver_supports_cuda, fx(CU128), []),
    ("driver: cu130 torch on the 570 host", abi.rule_driver_supports_cuda,
     fx(CU128, torch__version="2.11.0+cu130", torch__local="cu130", torch__cuda="13.0"), [("driver-cuda", "error")]),
    ("driver: CUDA 12 torch on a 520 driver", abi.rule_driver_supports_cuda,
     fx(CU128, gpu__driver="520.61.05", gpu__cuda_max="11.8"), [("driver-cuda", "error")]),
    ("driver: CUDA torch, no driver at all", abi.rule_driver_supports_cuda,
     fx(NOGPU, torch__version="2.11.0+cu128", torch__local="cu128", torch__cuda="12.8"), [("driver-cuda", "warning")]),
    ("driver: same major, older minor", abi.rule_driver_supports_cuda, fx(CU128, gpu__cuda_max="12.4"), [("driver-cuda", "warning")]),
    ("driver: cpu torch without GPU is silent", abi.rule_driver_supports_cuda, fx(NOGPU), []),
    # GPU arch vs arch list
    ("arch: H200 sm_90 in the cu130 list", abi.rule_gpu_arch_in_arch_list, fx(CU130), []),
    ("arch: H100 sm_90 in the cu128 list", abi.rule_gpu_arch_in_arch_list, fx(CU128), []),
    ("arch: V100 sm_70 on cu130 (Volta dropped)", abi.rule_gpu_arch_in_arch_list,
     fx(CU130, gpu__gpus=[{"index": 0, "name": "Tesla V100-SXM2-32GB", "compute_cap": "7.0", "memory_mib": 32768}]), [("gpu-arch", "error")]),
    ("arch: sm_90 only through PTX", abi.rule_gpu_arch_in_arch_list, fx(CU130, torch__arch_list=["sm_80", "compute_80"]), [("gpu-arch", "warning")]),
    ("arch: sm_90a build does not run on sm_89", abi.rule_gpu_arch_in_arch_list,
     fx(CU130, torch__arch_list=["sm_90a"], gpu__gpus=[{"index": 0, "name": "NVIDIA L40S", "compute_cap": "8.9"}]), [("gpu-arch", "error")]),
    ("arch: GPUs but a CPU torch", abi.rule_gpu_arch_in_arch_list,
     fx(CU130, torch__version="2.11.0+cpu", torch__local="cpu", torch__cuda=None, torch__arch_list=[]), [("gpu-arch", "error")]),
    ("arch: no GPU is silent", abi.rule_gpu_arch_in_arch_list, fx(NOGPU), []),
    # torch pins of installed packages
    ("pins: sglang ==2.11.0 matches 2.11.0+cu130 (PEP 440)", abi.rule_torch_pins, fx(CU130), []),
    ("pins: sgl-kernel built for torch 2.9.1", abi.rule_torch_pins, fx(PINS), [("torch-pins", "error")]),
    ("pins: sglang 0.5.11 on torch 2.13 (the sandbox)", abi.rule_torch_pins, fx(NOGPU), [("torch-pins", "warning")]),
    # torch importable
    ("torch: imports", abi.rule_torch_importable, fx(CU130), []),
    ("torch: broken import", abi.rule_torch_importable,
     fx(CU130, torch__status="broken", torch__error="libc10.so: cannot open shared object file"), [("torch-importable", "error")]),
    ("torch: import hangs", abi.rule_torch_importable, fx(CU130, torch__status="timeout"), [("torch-importable", "error")]),
    ("torch: not installed", abi.rule_torch_importable, fx(NOGPU, torch__status="missing"), [("torch-importable", "warning")]),
    # compiled files vs glibc
    ("glibc: real host", abi.rule_compiled_glibc, fx(NOGPU), []),
    ("glibc: host older than the .so needs", abi.rule_compiled_glibc, fx(NOGPU, glibc="2.31"), [("compiled-glibc", "error")]),
]




# What facts record for SGLang 0.5.19+'s Rust radix-tree core (readelf of the 0.5.21 wheel's .so)
RUST_TREE_CORE = {"path": "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-311-x86_64-linux-gnu.so",
                  "size": 3262768, "glibc_max": "2.34", "links_cuda": False, "links_libtorch": True,
                  "needed": ["libstdc++.so.6", "libtorch_python.so", "libtorch_cpu.so", "libc10.so", "libgcc_s.so.1",
                             "libc.so.6", "ld-linux-x86-64.so.2"]}


def stack(release: str, *, torch: str, kernel: str, flashinfer: str, python: str = "3.11.7", cuda: str | None = "13.0",
          pins_from_metadata: bool = True, **edits: Any) -> dict[str, Any]:
    """The H200 fixture with a whole stack swapped in: sglang ``release`` with the pins its wheel's METADATA states
    (or none, as on a host whose METADATA could not be read), the given torch / kernel / flashinfer / Python."""
    row = abi.stack_table()[release]
    local = "cpu" if cuda is None else "cu" + cuda.replace(".", "")
    pins = {"torch": f"=={row.torch}", "sglang-kernel": f"=={row.kernel}", "flashinfer-python": f"=={row.flashinfer}",
            "transformers": "==5.12.1"} if pins_from_metadata else {}
    facts = fx(CU130, packages__sglang__version=release, packages__sglang__pins=pins,
               packages__sglang__requires_torch=pins.get("torch"), **{"packages__sglang-kernel__version": kernel,
               "packages__flashinfer-python__version": flashinfer}, torch__version=f"{torch}+{local}",
               torch__release=torch, torch__local=local, torch__cuda=cuda, python__version=python,
               packages__torch__version=f"{torch}+{local}")
    for dotted, value in edits.items():
        node = facts
        *path, last = dotted.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    return facts


def stack_findings(facts: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted(pairs(abi.check_host("h", facts)))


# (case, facts, expected (rule, severity) of the whole host check)
STACK_CASES: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("0.5.18 on torch 2.13.0+cu130 with its own kernels",
     stack("0.5.18", torch="2.13.0", kernel="0.4.6.post1", flashinfer="0.6.17"), []),
    ("0.5.23 on torch 2.14.1+cu130, Python 3.11",
     stack("0.5.23", torch="2.14.1", kernel="0.4.10", flashinfer="0.7.2"), []),
    ("0.5.22 on Python 3.10", stack("0.5.22", torch="2.14.1", kernel="0.4.9", flashinfer="0.7.1", python="3.10.14"),
     [("python-floor", "error")]),
    ("0.5.21 on Python 3.10 is fine", stack("0.5.21", torch="2.13.0", kernel="0.4.7", flashinfer="0.6.18",
                                             python="3.10.14"), []),
    ("0.5.20 beside a cu128 torch", stack("0.5.20", torch="2.13.0", kernel="0.4.7", flashinfer="0.6.18", cuda="12.8",
                                         gpu__driver="580.95.05"), [("cuda-stack", "error")]),
    ("0.5.23 on a CPU host without a GPU (the sandbox's drift host)",
     stack("0.5.23", torch="2.14.1", kernel="0.4.10", flashinfer="0.7.2", cuda=None, gpu__status="absent",
           gpu__gpus=[]),
     [("no-gpu", "info")]),
    ("0.5.17 beside a cu128 torch is left to the other rules",
     stack("0.5.17", torch="2.11.0", kernel="0.4.5", flashinfer="0.6.15.post1", cuda="12.8"), []),
    ("0.5.19 upgraded, torch left at 2.11", stack("0.5.19", torch="2.11.0", kernel="0.4.6.post1", flashinfer="0.6.18"),
     [("kernel-torch", "error"), ("torch-pins", "warning")]),
    ("0.5.21's Rust TreeCore (links libtorch, built for 2.13) on torch 2.11: named in the warning",
     stack("0.5.21", torch="2.11.0", kernel="0.4.7", flashinfer="0.6.18", sglang__compiled=[RUST_TREE_CORE]),
     [("kernel-torch", "error"), ("torch-pins", "warning")]),
    ("0.5.21's Rust TreeCore on the torch it pins is fine",
     stack("0.5.21", torch="2.13.0", kernel="0.4.7", flashinfer="0.6.18", sglang__compiled=[RUST_TREE_CORE]), []),
    ("0.5.17's kernel 0.4.5 beside torch 2.13", stack("0.5.17", torch="2.13.0", kernel="0.4.5", flashinfer="0.6.15.post1"),
     [("kernel-torch", "error"), ("torch-pins", "warning")]),
    ("a kernel that pins torch itself is torch-pins' case",
     stack("0.5.18", torch="2.11.0", kernel="0.4.6.post1", flashinfer="0.6.17",
           **{"packages__sglang-kernel__requires_torch": "==2.13.0"}), [("torch-pins", "error"), ("torch-pins", "warning")]),
    ("0.5.20 with 0.5.19's kernel", stack("0.5.20", torch="2.13.0", kernel="0.4.6.post1", flashinfer="0.6.18"),
     [("companion-pins", "error")]),
    ("0.5.23 with 0.5.22's flashinfer", stack("0.5.23", torch="2.14.1", kernel="0.4.10", flashinfer="0.7.1"),
     [("companion-pins", "error")]),
    ("0.5.22 kernel mismatch seen from the table when the METADATA was not read",
     stack("0.5.22", torch="2.14.1", kernel="0.4.7", flashinfer="0.7.1", pins_from_metadata=False),
     [("companion-pins", "error"), ("kernel-torch", "error")]),
    ("0.5.18 on a GPU host without sglang-kernel",
     stack("0.5.18", torch="2.13.0", kernel="0.4.6.post1", flashinfer="0.6.17", **{"packages__sglang-kernel": None}),
     [("companion-pins", "error")]),
    ("0.5.18 without flashinfer (triton attention still works)",
     stack("0.5.18", torch="2.13.0", kernel="0.4.6.post1", flashinfer="0.6.17", **{"packages__flashinfer-python": None}),
     [("companion-pins", "warning")]),
    ("a release newer than the table: its METADATA pins alone",
     stack("0.5.23", torch="2.14.1", kernel="0.4.10", flashinfer="0.7.2", packages__sglang__version="0.5.24",
           python="3.10.14"), []),
]


@pytest.mark.parametrize("case,facts,expected", STACK_CASES, ids=[c[0] for c in STACK_CASES])
def test_stack_rules(case: str, facts: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    findings = abi.check_host("h", facts)
    assert sorted(pairs(findings)) == sorted(expected), [f.what for f in findings]
    for f in findings:
        assert f.what and f.why and f.fix


def test_stack_messages_name_the_release_and_the_fix() -> None:
    [py] = abi.rule_python_floor("h", stack("0.5.22", torch="2.14.1", kernel="0.4.9", flashinfer="0.7.1", python="3.10.14"))
    assert "sglang 0.5.22 needs Python >= 3.11" in py.what and "3.10.14" in py.what and "0.5.21" in py.fix
    [cuda] = abi.rule_cuda_major("h", stack("0.5.20", torch="2.13.0", kernel="0.4.7", flashinfer="0.6.18", cuda="12.8"))
    assert "CUDA 13" in cuda.what and "torch==2.13.0+cu130" in cuda.fix
    [kernel] = abi.rule_companion_pins("h", stack("0.5.20", torch="2.13.0", kernel="0.4.6.post1", flashinfer="0.6.18"))
    assert "sglang-kernel==0.4.7" in kernel.what and "0.4.6.post1" in kernel.what
    assert "pip install sglang==0.5.20" in kernel.fix
    [built] = abi.rule_kernel_torch("h", stack("0.5.19", torch="2.11.0", kernel="0.4.6.post1", flashinfer="0.6.18"))
    assert "built for torch 2.13.0" in built.what and "0.5.18, 0.5.19" in built.what and "torch==2.13.0" in built.fix


def test_the_sandbox_without_kernels_has_only_warnings() -> None:
    """A CPU host (the sandbox) carries neither sglang-kernel nor flashinfer: nothing to run them on, no error."""
    findings = abi.check_host("h", fx(NOGPU))
    assert not abi.has_errors(findings), [f.what for f in findings]
    assert ("companion-pins", "warning") in pairs(findings)


#: the SGLang releases whose wheels the rest of the suite reads anyway (the sandbox hosts, the patch-set tests)
SUITE_WHEELS = ("0.5.11", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.23")


@pytest.mark.wheels  # it fetches the real wheels (make test-fast leaves it out)
def test_stack_table_matches_the_wheels_read_by_the_suite() -> None:
    """Each row (the ``stack:`` of the release's patch-set folder) against the real wheel's METADATA for the releases
    the suite reads (0.5.11, 0.5.14-0.5.17, 0.5.23), as written and as ``patchset port`` reads it."""
    import zipfile
    from email.parser import Parser

    from packaging.requirements import Requirement

    from ddtree_deploy.patchset.port import pinned_stack
    from ddtree_deploy.wheels import fetch_wheel

    # fetched here (cached for the rest of the suite): a test that read only what other files had fetched
    # found nothing when it ran before them on its worker
    table = abi.stack_table()
    for release in SUITE_WHEELS:
        wheel = fetch_wheel("sglang", release)
        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        meta = Parser().parsestr(text)
        reqs = {Requirement(r).name.lower().replace("_", "-"): Requirement(r) for r in meta.get_all("Requires-Dist")
                if "extra ==" not in r}
        row = table[release]
        assert str(reqs["torch"].specifier) == f"=={row.torch}", release
        assert str(reqs["sglang-kernel"].specifier) == f"=={row.kernel}", release
        assert str(reqs["flashinfer-python"].specifier) == f"=={row.flashinfer}", release
        assert meta["Requires-Python"] == f">={row.python_min}", release
        assert pinned_stack(text) == {"torch": row.torch, "kernel": row.kernel, "flashinfer": row.flashinfer,
                                      "python": row.python_min}, release


def test_stack_table_is_read_from_the_patch_set_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every release with a folder has its row, from that folder's ``stack:``; a folder added under the patches
    root in use (a new base, ported) gives its release a row with no edit of the tool; a release with no folder has
    none, and is judged by the host's own METADATA pins alone."""
    from packaging.version import Version

    table = abi.stack_table()
    folders = sorted((p.name.split("-", 1)[1] for p in (REPO / "patches" / "ddtree").glob("sglang-*")), key=Version)
    assert list(table) == folders, "a row per folder, oldest first"
    assert table["0.5.17"] == abi.Stack("2.11.0", "0.4.5", "0.6.15.post1", "3.10", None)
    assert table["0.5.22"] == abi.Stack("2.14.1", "0.4.9", "0.7.1", "3.11", 13)
    newest = Version(folders[-1])
    later = f"{newest.major}.{newest.minor}.{newest.micro + 1}"  # a release after every folder there is
    assert later not in table
    new = tmp_path / "patches" / "ddtree" / f"sglang-{later}"
    new.mkdir(parents=True)
    text = (REPO / "patches" / "ddtree" / f"sglang-{folders[-1]}" / "patchset.yaml").read_text()
    (new / "patchset.yaml").write_text(text.replace(folders[-1], later).replace('python: "3.11"', 'python: "3.12"'))
    monkeypatch.setenv("DDTREE_PATCHES", str(tmp_path / "patches"))
    table = abi.stack_table()
    assert table[later].python_min == "3.12" and table["0.5.23"] == abi.Stack("2.14.1", "0.4.10", "0.7.2", "3.11", 13)
    facts = stack("0.5.23", torch="2.14.1", kernel="0.4.10", flashinfer="0.7.2", packages__sglang__version=later,
                  python="3.11.7")
    [floor] = abi.rule_python_floor("h", facts)
    assert floor.rule == "python-floor" and f"sglang {later} needs Python >= 3.12" in floor.what


@pytest.mark.parametrize("case,rule,facts,expected", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_host_rule(case: str, rule: Callable[[str, dict[str, Any]], list[abi.Finding]], facts: dict[str, Any],
                   expected: list[tuple[str, str]]) -> None:
    findings = rule("h", facts)
    assert pairs(findings) == expected, [f.what for f in findings]
    for f in findings:
        assert f.host == "h" and f.what and f.why and f.fix


OVERLAY_CASES = [
    ("same build: silent", fx(CU130), fx(CU130), True, []),
    ("not compiled: silent", fx(CU128), fx(CU130), False, []),
    ("cu130 build onto cu128", fx(CU128), fx(CU130), True, [("overlay-compiled", "error"), ("overlay-compiled", "error")]),  # CUDA tag and torch.version.cuda
    ("other torch release", fx(CU130, torch__release="2.10.0", torch__version="2.10.0+cu130"), fx(CU130), True, [("overlay-compiled", "error")]),
    ("other python ABI", fx(CU130, python__abi_tag="cp312"), fx(CU130), True, [("overlay-compiled", "error")]),
    ("older glibc on target", fx(CU130, glibc="2.31"), fx(CU130), True, [("overlay-compiled", "error")]),
    ("newer glibc on target loads", fx(CU130, glibc="2.39"), fx(CU130), True, [("overlay-compiled", "warning")]),
    ("other C++ ABI", fx(CU130, torch__cxx11_abi=False), fx(CU130), True, [("overlay-compiled", "error")]),
]


@pytest.mark.parametrize("case,target,source,compiled,expected", OVERLAY_CASES, ids=[c[0] for c in OVERLAY_CASES])
def test_rule_compiled_files_built_elsewhere(case: str, target: dict, source: dict, compiled: bool, expected: list[tuple[str, str]]) -> None:
    findings = abi.rule_compiled_files_built_elsewhere("t", target, source, compiled)
    assert sorted(pairs(findings)) == sorted(expected), [f.what for f in findings]


REQ_CASES = [
    ("torch range met (local label ignored)", fx(CU130), {"torch": ">=2.11,<2.12", "triton": ">=3.4", "python": ">=3.10"}, []),
    ("torch range not met (sandbox torch 2.13)", fx(NOGPU), {"torch": ">=2.11,<2.12"}, [("requirements", "error")]),
    ("==2.11.0 matches +cu128 too", fx(CU128), {"torch": "==2.11.0"}, []),
    ("local label compared explicitly", fx(CU128), {"torch": "==2.11.0+cu130"}, [("requirements", "error")]),
    ("local label met", fx(CU130), {"torch": "==2.11.0+cu130"}, []),
    ("triton too old", fx(CU130, packages__triton__version="3.3.1"), {"triton": ">=3.4"}, [("requirements", "error")]),
    ("python too old", fx(CU130), {"python": ">=3.12"}, [("requirements", "error")]),
    ("package missing", fx(NOGPU), {"flashinfer-python": ">=0.6"}, [("requirements", "error")]),
    ("kernel by either name", fx(PINS), {"sglang-kernel": ">=0.3"}, []),
    ("bad specifier", fx(CU130), {"torch": "2.11 or so"}, [("requirements", "error")]),
    ("cuda version", fx(CU128), {"cuda": ">=13.0"}, [("requirements", "error")]),
]


@pytest.mark.parametrize("case,facts,requires,expected", REQ_CASES, ids=[c[0] for c in REQ_CASES])
def test_rule_requirements(case: str, facts: dict, requires: dict[str, str], expected: list[tuple[str, str]]) -> None:
    assert pairs(abi.rule_requirements("h", facts, requires)) == expected


@pytest.mark.parametrize("base,expected", [("0.5.11", []), ("0.5.23", [("base-version", "error")]), ("", [])])
def test_rule_base_version(base: str, expected: list[tuple[str, str]]) -> None:
    assert pairs(abi.rule_base_version("h", fx(CU130), base)) == expected


def test_rule_shared_binaries() -> None:
    differ = abi.rule_shared_binaries({"a": fx(CU130), "b": fx(CU128)})
    assert pairs(differ) == [("shared-binaries", "warning")]
    assert "torch_local cu130 vs cu128" in differ[0].what
    same = abi.rule_shared_binaries({"a": fx(CU130), "b": fx(PINS)})
    assert pairs(same) == []


def test_check_hosts_compatible_pair_has_no_errors() -> None:
    findings = abi.check_hosts({"a": fx(CU130), "b": fx(CU130, host="b")})
    assert pairs(findings) == []


def test_check_hosts_eval_pair() -> None:
    findings = abi.check_hosts({"cu130": fx(CU130), "cu128": fx(CU128), "pins": fx(PINS)})
    assert abi.has_errors(findings)
    assert sorted((f.host, f.rule, f.severity) for f in findings) == [
        ("cu128", "shared-binaries", "warning"), ("pins", "companion-pins", "error"), ("pins", "torch-pins", "error")]
    kernel = next(f for f in findings if f.rule == "companion-pins")
    assert "sglang-kernel==0.4.2" in kernel.what and "sgl-kernel 0.3.16.post3" in kernel.what


def test_check_overlay_refuses_cu130_build_on_cu128_host() -> None:
    req = {"python": ">=3.10", "torch": ">=2.11,<2.12", "triton": ">=3.4"}
    bad = abi.check_overlay("cu128", fx(CU128), built_from_facts=fx(CU130), carries_compiled=True, requires=req,
                            base_version="0.5.11")
    assert abi.has_errors(bad) and pairs(bad) == [("overlay-compiled", "error")] * 2  # CUDA tag, torch.version.cuda
    good = abi.check_overlay("cu128", fx(CU128), built_from_facts=fx(CU128), carries_compiled=True, requires=req,
                             base_version="0.5.11")
    assert pairs(good) == []


def test_arch_runs_on() -> None:
    assert abi.arch_runs_on(["sm_80"], "8.6") == "sass"
    assert abi.arch_runs_on(["sm_86"], "8.0") is None
    assert abi.arch_runs_on(["sm_120a"], "12.1") is None
    assert abi.arch_runs_on(["compute_90"], "10.0") == "ptx"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=REPO, columns=250)  # wide enough that table cells are not wrapped mid-word


def test_cli_abi_with_recorded_facts_exits_4_on_errors() -> None:
    files = ["--facts", str(FIXTURES / f"{CU130}.json"), "--facts", str(FIXTURES / f"{CU128}.json")]
    ok = _cli("abi", *files, "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["hosts"] == ["cu130-h200", "cu128-h100"]
    row = {r["fact"]: r for r in doc["matrix"]}["torch CUDA tag"]
    assert row["differs"] and row["values"] == {"cu130-h200": "cu130", "cu128-h100": "cu128"}
    bad = _cli("abi", *files, "--built-on", "cu130-h200")
    assert bad.returncode == 4, bad.stdout + bad.stderr
    assert "overlay-compiled" in bad.stdout and "incompatible" in bad.stdout


def test_cli_abi_bad_facts_file_names_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    r = _cli("abi", "--facts", str(broken))
    assert r.returncode == 2 and "broken.json" in r.stderr
