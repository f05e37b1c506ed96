"""CPU checks of the FlashInfer bundle (.e2e17fi), run by bench/e2e/fi_cpu_check.sh with the bundle installed into a
--target folder on PYTHONPATH (and, for `fake`, the 0.5.17 bundle's cpu-check/fake_cuda.py importable).

    python -m bench.e2e.fi_cpu_check imports [--fake] MODULE...   import them; say where FlashInfer and each
                                                                 third-party package came from
    python -m bench.e2e.fi_cpu_check lazy --fake                  try every import made inside a function of SGLang's
                                                                 FlashInfer backend and of the flashinfer modules it
                                                                 loaded (the ones its run-time calls make)
    python -m bench.e2e.fi_cpu_check registry --fake OUT.json     SGLang's model registry: the architectures it loads
    python -m bench.e2e.fi_cpu_check args --fake MODELS CONFIG... the driver's engine arguments of each configuration,
                                                                 resolved by SGLang's ServerArgs after its plugins
                                                                 load, as sglang.Engine does (the DDTree overlay's
                                                                 hooks: its checks, refusals and widths)
    python -m bench.e2e.fi_cpu_check jit NAME...                  compile (not run) FlashInfer's JIT modules with the
                                                                 local nvcc: cascade, quantization, decode-hdN,
                                                                 prefill-fa2-hdN, prefill-fa3-hdN (bf16, int32 indices)
`--fake`: the 0.5.17 bundle's fake_cuda first (torch reports one sm90 H200), so SGLang's CUDA branches run and
`is_flashinfer_available()` is true, as on the GPU.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import sys
import time


def _fake(argv: list[str]) -> list[str]:
    if argv and argv[0] == "--fake":
        import fake_cuda  # noqa: F401  (the 0.5.17 bundle's cpu-check/: must come first)

        return argv[1:]
    return argv


def imports(mods: list[str]) -> int:
    rc = 0
    for m in mods:
        try:
            importlib.import_module(m)
            print(f"ok   {m}")
        except BaseException as e:  # noqa: BLE001 - every failure is the finding
            rc = 1
            print(f"FAIL {m}: {type(e).__name__}: {str(e)[:300]}")
    from sglang.srt.utils import is_flashinfer_available

    import flashinfer

    print("is_flashinfer_available():", is_flashinfer_available(), "| flashinfer", flashinfer.__version__,
          flashinfer.__file__)
    fb = sys.modules.get("sglang.srt.layers.attention.flashinfer_backend")
    if fb is not None and is_flashinfer_available():
        import flashinfer.prefill

        real = getattr(fb, "BatchPrefillWithPagedKVCacheWrapper", None) is flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper
        print("flashinfer_backend uses the real wrappers:", real)
        rc |= 0 if real else 1
    tops: dict[str, str] = {}
    for name, mod in list(sys.modules.items()):
        f = (getattr(mod, "__dict__", None) or {}).get("__file__") or ""
        top = name.split(".")[0]
        if top not in tops and ("-packages/" in f or "/site/" in f):
            tops.setdefault(top, "bundle" if "/site/" in f else "image venv")
    for where in ("bundle", "image venv"):
        print(f"third-party packages loaded from the {where}:", " ".join(sorted(k for k, v in tops.items() if v == where)))
    return rc


def _function_imports(path: str) -> set[tuple[int, str]]:
    """(level, module) of every import statement inside a function of the file."""
    out = set()
    for fn in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out |= {(0, a.name) for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    out.add((node.level, node.module))
    return out


def lazy() -> int:
    import importlib.util

    import sglang.srt.layers.attention.flashinfer_backend as fb

    roots = [fb.__name__] + sorted(m for m in sys.modules if m.startswith("flashinfer"))
    wanted: dict[str, set[str]] = {}
    for name in roots:
        f = (getattr(sys.modules.get(name), "__dict__", None) or {}).get("__file__")
        if not f or not f.endswith(".py"):
            continue
        pkg = name if f.endswith("__init__.py") else name.rpartition(".")[0]
        for level, m in _function_imports(f):
            full = importlib.util.resolve_name("." * level + m, pkg) if level else m
            wanted.setdefault(full, set()).add(name)
    fails = 0
    for m in sorted(wanted):
        if m in sys.modules:
            continue
        try:
            importlib.import_module(m)
        except BaseException as e:  # noqa: BLE001
            fails += 1
            print(f"FAIL {m:60s} {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''} | from "
                  + ", ".join(sorted(wanted[m])[:3]))
    print(f"lazy imports: {len(wanted)} modules named in {len(roots)} loaded modules, {fails} failed")
    return 0


def registry(out: str) -> int:
    import logging

    logging.disable(logging.WARNING)  # the "Ignore import error" lines: the diff below says what they cost
    from sglang.srt.models.registry import import_model_classes

    archs = sorted(import_model_classes("sglang.srt.models"))
    json.dump(archs, open(out, "w"))
    need = ["Qwen3ForCausalLM", "DFlashDraftModel", "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration"]
    missing = [a for a in need if a not in archs]
    print(f"{len(archs)} architectures; the e2e model sets' ({', '.join(need)}):",
          "all there" if not missing else f"MISSING {missing}")
    return 1 if missing else 0


def args(models: str, names: list[str]) -> int:
    os.environ["E2E_MODELS"] = models
    from bench.e2e import driver
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()  # as sglang.Engine does before it builds ServerArgs: the DDTree overlay's hooks run in it

    keys = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
            "speculative_draft_attention_backend", "speculative_algorithm", "speculative_num_draft_tokens",
            "speculative_ddtree_budget", "speculative_ddtree_allow_unproven", "sampling_backend", "page_size",
            "disable_overlap_schedule")
    rc = 0
    for name in names:
        kw = driver.engine_kwargs(driver.parse(name))
        try:
            sa = ServerArgs(**kw)
            print(name, {k: getattr(sa, k, "<absent>") for k in keys})
        except BaseException as e:  # noqa: BLE001
            rc = 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:600]}")
    return rc


def jit(names: list[str]) -> int:
    import torch
    from flashinfer.jit.attention.modules import gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.quantization import gen_quantization_module

    bf16, i32 = torch.bfloat16, torch.int32

    def spec(name: str):
        if name == "cascade":
            return gen_cascade_module()
        if name == "quantization":
            return gen_quantization_module()
        kind, *rest = name.split("-")
        hd = int(rest[-1][2:])
        if kind == "prefill":  # (backend, q, kv, o, idx, head dims, pos enc, swa, soft cap, fp16 qk reduction)
            return gen_batch_prefill_module(rest[0], bf16, bf16, bf16, i32, hd, hd, 0, False, False, False)
        return gen_batch_decode_module(bf16, bf16, bf16, i32, hd, hd, 0, False, False)

    rc = 0
    for name in names:
        s = spec(name)
        t = time.time()
        try:
            s.build(verbose=False)
            print(f"ok   {name}: {time.time() - t:.0f} s, {s.jit_library_path.stat().st_size / 2**20:.1f} MiB  {s.name}",
                  flush=True)
        except BaseException as e:  # noqa: BLE001
            rc = 1
            print(f"FAIL {name}: {time.time() - t:.0f} s {type(e).__name__}: {str(e)[-2500:]}", flush=True)
    return rc


def main(argv: list[str]) -> int:
    cmd, rest = argv[0], _fake(argv[1:])
    if cmd == "imports":
        return imports(rest)
    if cmd == "lazy":
        return lazy()
    if cmd == "registry":
        return registry(rest[0])
    if cmd == "args":
        return args(rest[0], rest[1:])
    if cmd == "jit":
        return jit(rest)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
