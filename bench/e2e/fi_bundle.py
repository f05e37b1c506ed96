"""What the FlashInfer bundle (`.e2e17fi/`, bench/e2e/mk_bundle_flashinfer.sh) keeps of the wheels it trims.

    python -m bench.e2e.fi_bundle keep flashinfer|transformers|tvm-ffi WHEEL    one kept member per line
    python -m bench.e2e.fi_bundle trim flashinfer|transformers|tvm-ffi IN.whl OUT.whl TRIM_WHEEL_PY
                                                    IN.whl without the rest (the 0.5.17 bundle's build/trim_wheel.py
                                                    --keep writes it and its RECORD)
    python -m bench.e2e.fi_bundle jit-times WORKSPACE_BASE   the modules FlashInfer's JIT built under
                                                    WORKSPACE_BASE/.cache/flashinfer (gpu_run.sh: FLASHINFER_WORKSPACE_BASE),
                                                    with the seconds from each one's ninja file to its library

- **flashinfer** (`flashinfer_python`): its Python modules stay (what `import flashinfer` and SGLang's FlashInfer
  backend load, checked on CPU, and what they import lazily) except those that can never import here: a module whose
  own top level imports the CuTe DSL (`cutlass`, from nvidia-cutlass-dsl) or cuTile (`cuda.tile`), neither of
  which the bundle or the image has, and every module below a package whose `__init__.py` does (every `__init__.py`
  stays, so importing such a package still fails as it did, with ModuleNotFoundError). Of `flashinfer/data/` (the JIT's sources and headers:
  `csrc/`, `include/`, `cutlass/`, `cccl/`, `spdlog/`) stay the vendored CCCL's header trees whole
  (:data:`FI_WHOLE`: the JIT puts them on the include path ahead of the CUDA toolkit's own CCCL, so the toolkit's
  headers include them too, which no closure over the wheel's files sees; a partial copy mixes two CCCL versions and
  does not compile) and the `#include` closure of :data:`FI_ROOTS`: the sources of the JIT modules SGLang's
  FlashInfer attention backend builds (batch prefill fa2 / fa3, batch decode, the cascade merge, the custom mask's bit
  packing) and of the small kernels beside them (page, sampling, norm, rope, activation), resolved through the JIT's
  include path (flashinfer/jit/cpp_ext.py) with every candidate kept and preprocessor conditions ignored, so a
  superset of what any of them includes from CUTLASS, spdlog and FlashInfer's own headers. Everything else in `data/`
  (CUTLASS's examples, tests, Python and unreached headers, CCCL's benchmarks, docs and Python, the GEMM / MoE / comm
  / MLA kernels' sources) is included by none of them; JIT modules outside this set would not compile here.
- **transformers** (0.5.17's pin, 5.12.1): `models/*/modular_*.py` and `convert_*` are never imported (transformers'
  own import structure skips them); the per-model `modeling_*`, `image_processing_*`, `processing_*`,
  `video_processing_*` and `feature_extraction_*` files go except for the models in :data:`TF_KEEP_MODELS` (SGLang's
  imports on this path load only `auto`'s and `llama`'s; bench/e2e/models' makers build Qwen3 and Qwen3-Next). Every
  configuration and tokenizer file stays. SGLang's model registry then skips the SGLang model files that import a
  dropped one (logged "Ignore import error"); the CPU check lists which architectures that removes.
- **tvm-ffi** (`apache_tvm_ffi`): the source tree of libbacktrace (`3rdparty/libbacktrace`, for building the
  library; not on its JIT include path, which is `tvm_ffi/include`). Its `lib/libtvm_ffi_testing.so` stays:
  `tvm_ffi/core.abi3.so` links it.
"""
from __future__ import annotations

import ast
import fnmatch
import glob
import posixpath
import re
import subprocess
import sys
import zipfile
from pathlib import Path

#: flashinfer/data/csrc sources (and two headers) of the JIT modules on SGLang's FlashInfer backend's path, and of
#: the small kernels beside them; fnmatch patterns relative to flashinfer/data/ (``*`` also matches ``/``).
FI_ROOTS = (
    "csrc/batch_prefill*", "csrc/batch_decode.cu", "csrc/batch_decode_customize_config.jinja",
    "csrc/batch_decode_jit_binding.cu", "csrc/batch_decode_kernel_inst.jinja", "csrc/single_prefill*",
    "csrc/single_decode*", "csrc/cascade.cu", "csrc/flashinfer_cascade_binding.cu", "csrc/quantization.cu",
    "csrc/flashinfer_quantization_binding.cu", "csrc/page.cu", "csrc/flashinfer_page_binding.cu",
    "csrc/sampling.cu", "csrc/renorm.cu", "csrc/flashinfer_sampling_binding.cu", "csrc/norm.cu",
    "csrc/flashinfer_norm_binding.cu", "csrc/rope.cu", "csrc/flashinfer_rope_binding.cu", "csrc/tvm_ffi_utils.h",
    # what the JIT writes into generated sources: the attention variants' declarations (jit/attention/variants.py)
    # and the activation kernels' header (jit/activation.py)
    "include/flashinfer/attention/variants.cuh", "include/flashinfer/attention/hopper/variants.cuh",
    "include/flashinfer/activation.cuh",
)
#: The JIT's include path below flashinfer/data/ (flashinfer/jit/env.py, cpp_ext.py: CCCL first, then the rest).
FI_INCLUDE_PATH = ("cccl/cub", "cccl/libcudacxx/include", "cccl/thrust", "include", "csrc", "cutlass/include",
                   "cutlass/tools/util/include", "spdlog/include")
#: The vendored CCCL's header trees, kept whole (see the module docstring), below flashinfer/data/.
FI_WHOLE = ("cccl/cub/cub/", "cccl/thrust/thrust/", "cccl/libcudacxx/include/")
FI_DATA = "flashinfer/data/"
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)

#: transformers model folders whose per-model code stays (see the module docstring).
TF_KEEP_MODELS = frozenset({"auto", "llama", "qwen2", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5",
                            "qwen3_5_moe"})
_TF_PER_MODEL = ("modeling_", "image_processing_", "processing_", "video_processing_", "feature_extraction_")


def include_closure(names: dict[str, str], read, roots: list[str]) -> set[str]:
    """The files (keys of ``names``, paths below flashinfer/data/) that ``roots`` include, transitively, through
    :data:`FI_INCLUDE_PATH` and the including file's own folder; every existing candidate of an include is kept."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for inc in _INCLUDE.findall(read(names[rel]).decode("utf-8", "replace")):
            cands = [posixpath.normpath(posixpath.join(posixpath.dirname(rel), inc))]
            cands += [posixpath.join(d, inc) for d in FI_INCLUDE_PATH]
            todo += [c for c in cands if c in names and c not in seen]
    return seen


def flashinfer_keep(wheel: zipfile.ZipFile) -> list[str]:
    names = {n[len(FI_DATA):]: n for n in wheel.namelist() if n.startswith(FI_DATA) and not n.endswith("/")}
    roots = sorted(r for r in names if any(fnmatch.fnmatch(r, g) for g in FI_ROOTS))
    missing = [g for g in FI_ROOTS if not any(fnmatch.fnmatch(r, g) for r in names)]
    if missing:
        raise SystemExit(f"fi_bundle: no file in the wheel's data/ matches {missing}: the JIT's sources moved")
    data = {names[r] for r in include_closure(names, wheel.read, roots)}
    data |= {n for r, n in names.items() if r.startswith(FI_WHOLE)}
    # the Python package less what cannot import without the CuTe DSL / cuTile; the wheel's top-level build scripts
    # (build_backend.py, build_utils.py) are not part of it
    code = {n for n in wheel.namelist() if n.startswith("flashinfer/") and not n.startswith(FI_DATA)}
    dead = {n for n in code if n.endswith(".py") and _needs_missing_dsl(wheel.read(n))}
    dead_pkgs = tuple(n[: -len("__init__.py")] for n in dead if n.endswith("/__init__.py"))
    drop = {n for n in code if not n.endswith("/__init__.py") and (n in dead or n.startswith(dead_pkgs))}
    return sorted((code - drop) | data)


#: Top-level packages that neither the bundle nor the GPU image has (nvidia-cutlass-dsl's CuTe DSL, cuda-tile).
_MISSING_DSLS = ("cutlass", "cuda.tile")


def _needs_missing_dsl(source: bytes) -> bool:
    """Does the module's own top level (not inside try, if or a function) import one of :data:`_MISSING_DSLS`?"""
    def missing(name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in _MISSING_DSLS)

    for node in ast.parse(source).body:
        if isinstance(node, ast.Import) and any(missing(a.name) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and missing(node.module):
            return True
    return False


def transformers_keep(wheel: zipfile.ZipFile) -> list[str]:
    keep = []
    for n in wheel.namelist():
        parts = n.split("/")
        if n.startswith("transformers/models/") and len(parts) == 4:
            base = parts[3]
            if base.startswith(("modular_", "convert_")):
                continue
            if base.startswith(_TF_PER_MODEL) and parts[2] not in TF_KEEP_MODELS:
                continue
        keep.append(n)
    return sorted(keep)


def tvm_ffi_keep(wheel: zipfile.ZipFile) -> list[str]:
    return sorted(n for n in wheel.namelist() if not n.startswith("tvm_ffi/3rdparty/libbacktrace/"))


KEEP = {"flashinfer": flashinfer_keep, "transformers": transformers_keep, "tvm-ffi": tvm_ffi_keep}


def jit_times(base: Path) -> list[str]:
    """One line per JIT module under BASE/.cache/flashinfer/VERSION/ARCH/cached_ops/NAME: its library's size and the
    seconds from its build.ninja (written just before ninja runs) to its NAME.so (linked last); "not built" where the
    build failed or was interrupted. Printed by gpu_run.sh into $OUT/flashinfer-jit.txt (SGLang sets FlashInfer's
    logger to ERROR, so its own "Loading JIT ops" lines never reach the engine logs)."""
    lines = []
    for ninja in sorted(base.glob(".cache/flashinfer/*/*/cached_ops/*/build.ninja")):
        so = ninja.parent / f"{ninja.parent.name}.so"
        where = "/".join(ninja.parts[-5:-3])
        if so.exists():
            dt = so.stat().st_mtime - ninja.stat().st_mtime
            lines.append(f"{dt:7.1f} s  {so.stat().st_size / 2**20:6.2f} MiB  {where}  {ninja.parent.name}")
        else:
            lines.append(f"  not built          {where}  {ninja.parent.name}")
    total = sum(float(ln.split()[0]) for ln in lines if not ln.lstrip().startswith("not"))
    return lines + [f"{len(lines)} modules, {total:.1f} s of JIT builds (one after another when they did not overlap)"]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "jit-times":
        print("\n".join(jit_times(Path(argv[1]))))
        return 0
    if len(argv) < 3 or argv[0] not in ("keep", "trim") or argv[1] not in KEEP:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    wheel = zipfile.ZipFile(argv[2])
    kept = [n for n in KEEP[argv[1]](wheel) if not n.endswith("/")]
    if argv[0] == "keep":
        print("\n".join(kept))
        return 0
    out, trim_wheel = argv[3], argv[4]
    # trim_wheel.py --keep matches fnmatch globs: each kept name, escaped, is its own glob
    return subprocess.call([sys.executable, trim_wheel, "--keep", argv[2], out, *map(glob.escape, kept)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
