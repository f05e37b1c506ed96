"""Which torch symbols an sglang-kernel build needs that this machine's torch does not export.

sglang-kernel's ``sgl_kernel/sm90/common_ops.abi3.so`` links libtorch: a build made against one torch fails to load
on another with ``undefined symbol: ...``. The wheels are 373-383 MB, too large to carry to the GPU machine, so the
symbol lists travel instead: ``kernel_abi/sglang_kernel-<version>-sm90.syms`` holds the library's undefined c10 / at /
torch symbols (mangled, one per line), made here with
``nm -D --undefined-only sgl_kernel/sm90/common_ops.abi3.so | awk '{print $2}' | grep -E '^_ZN?K?(3c10|2at|5torch)'``
on the wheel's extracted library. On the GPU machine this looks each one up (``dlsym``) in the libraries under the
installed torch's ``lib/`` and reports those none of them exports: the exact names the dynamic loader would refuse.

Usage: python3 -m bench.e2e.kernel_abi OUT.json [SYMS ...]   (default: every list under bench/e2e/kernel_abi/)
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "kernel_abi"


def torch_libraries() -> tuple[str, list[ctypes.CDLL]]:
    import torch  # the machine's own torch: its lib/ holds libc10, libtorch_cpu, libtorch_cuda, ...

    lib_dir = Path(torch.__file__).parent / "lib"
    libs = []
    for path in sorted(lib_dir.glob("lib*.so*")):
        try:
            libs.append(ctypes.CDLL(str(path)))
        except OSError:
            continue  # a test library with its own missing dependencies: not one sgl_kernel links
    return torch.__version__, libs


def demangle(names: list[str]) -> list[str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=30)
        lines = out.stdout.splitlines()
        return lines if out.returncode == 0 and len(lines) == len(names) else names
    except (OSError, subprocess.TimeoutExpired):
        return names


def check(syms_file: Path, libs: list[ctypes.CDLL]) -> dict:
    wanted = [s.strip() for s in syms_file.read_text().splitlines() if s.strip()]
    missing = []
    for name in wanted:
        if not any(hasattr(lib, name) for lib in libs):
            missing.append(name)
    return {"list": syms_file.name, "needed": len(wanted), "missing": len(missing),
            "missing_symbols": missing, "missing_demangled": demangle(missing) if missing else []}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    files = [Path(a) for a in argv[1:]] or sorted(HERE.glob("*.syms"))
    version, libs = torch_libraries()
    rows = [check(f, libs) for f in files]
    out.write_text(json.dumps({"torch": version, "libraries": len(libs), "kernels": rows}, indent=1) + "\n")
    for row in rows:
        verdict = "loads (every torch symbol found)" if not row["missing"] else f"{row['missing']} missing"
        print(f"torch {version}: {row['list']}: {row['needed']} torch symbols needed, {verdict}")
        for name in row["missing_demangled"][:4]:
            print("   ", name[:220])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
