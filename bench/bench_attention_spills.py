"""Register spills of the verify attention kernels on Hopper, read off ptxas without a GPU (issues #29, #24).

A DDTree verify's attention, at the target shapes DDTree serves, compiled for sm_90a with Triton's own compiler and
the ptxas it ships: SGLang's triton extend kernel (its source read from the real SGLang wheel, its two launch forms:
the chain's causal one and a tree's custom-mask one, at the tile sizes SGLang picks on Hopper) against DDTree's
tree-verify kernel at the settings its ``plan`` picks. ptxas reports registers per thread and bytes spilled to local
memory per thread; a spill is a load and a store to memory inside the kernel's main loop. The attribution on the H100
(round-overhead-h100-attribution.md) found SGLang's kernel 1.45-1.61x slower with a tree mask than without; this
shows why, and that DDTree's kernel does not spill. It is static: it says nothing of speed by itself
(bench_verify_attention.py times the kernels on a GPU).

    python bench/bench_attention_spills.py            # bench/results/verify-attention-spills.{md,json}
    python bench/bench_attention_spills.py --sglang 0.5.23 --out /tmp

Needs Triton with its NVIDIA backend (the ptxas it ships) and the SGLang wheel (downloaded once, no dependencies).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python bench/bench_attention_spills.py"
KERNEL_FILE = "sglang/kernels/ops/attention/extend_attention.py"
#: name -> (title, query heads, KV heads, head dim, verify width)
SHAPES = {"q8b-b16": ("Qwen3-8B, b16 (17 verified)", 32, 8, 128, 17),
          "q8b-b64": ("Qwen3-8B, b64 (65 verified)", 32, 8, 128, 65),
          "q36-b16": ("Qwen3.6-27B attention layers, b16", 24, 4, 256, 17)}
#: SGLang's tile sizes on Hopper (``_get_block_sizes_for_extend_attention``: 128 x 64 up to head dim 128, 64 x 64
#: up to 256, 8 warps), checked against the source below
SGLANG_HOPPER = {128: (128, 64, 8), 256: (64, 64, 8)}


def ptxas_report(kernel) -> dict:
    ptxas = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as fh:
        fh.write(kernel.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", fh.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(fh.name)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    if r.returncode != 0 or spill is None or regs is None:
        raise RuntimeError(f"ptxas failed: {r.stderr[-800:]}")
    return {"registers": int(regs.group(1)), "spill_bytes": int(spill.group(1))}


def compile_for_hopper(fn, const: dict, types_: dict, warps: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in const else types_.get(n, "i32") for n in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(n),): v for n, v in const.items()})
    return ptxas_report(triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                       options={"num_warps": warps, "num_stages": 1}))


def sglang_kernel(version: str):
    """SGLang's ``_fwd_kernel`` from its wheel, with its module's imports of the rest of SGLang stubbed (only the
    Triton function is compiled; nothing of SGLang runs)."""
    sys.path.insert(0, str(ROOT))
    from ddtree_deploy.wheels import fetch_wheel

    wheel = fetch_wheel("sglang", version)
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(KERNEL_FILE).decode()
    for name, attrs in {"sglang": {}, "sglang.kernels": {}, "sglang.kernels.ops": {}, "sglang.kernels.ops.attention": {},
                        "sglang.kernels.ops.attention.decode_attention": {"_extract_kv_strides": None},
                        "sglang.kernels.ops.attention.prefill_attention": {"context_attention_fwd": None},
                        "sglang.kernels.ops.attention.score_mod": {"unpack_aux_tensors": None},
                        "sglang.srt": {}, "sglang.srt.utils": {"is_cuda": lambda: False, "is_hip": lambda: False,
                                                               "is_gfx95_supported": lambda: False}}.items():
        mod = sys.modules.setdefault(name, types.ModuleType(name))
        for key, value in attrs.items():
            setattr(mod, key, value)
    path = Path(tempfile.mkdtemp()) / "sglang_extend_attention.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sglang_extend_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._fwd_kernel, source, wheel.name


def measure(version: str, progress=print) -> tuple[list[dict], str]:
    sys.path.insert(0, str(ROOT))
    import torch
    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime

    rt = load_runtime(ROOT / "patches" / "ddtree" / "runtime")
    ours = importlib.import_module(rt.__name__ + ".tree_attn_triton")
    theirs, source, wheel = sglang_kernel(version)
    if "BLOCK_M, BLOCK_N = (128, 64)" not in source:
        raise SystemExit(f"bench_attention_spills: {wheel} no longer picks 128 x 64 tiles on Hopper; update SGLANG_HOPPER")
    sg_types = {"LSE_Extend": "*fp32", "qo_indptr": "*i32", "kv_indptr": "*i32", "kv_indices": "*i64",
                "mask_ptr": "*i1", "mask_indptr": "*i64", "sink_ptr": "*fp32", "window_kv_offset_ptr": "*i32",
                "sm_scale": "fp32", "k_scale": "fp32", "v_scale": "fp32", "Aux0": "*fp32"}
    our_types = {"O_part": "*fp32", "L_part": "*fp32", "qo_indptr": "*i32", "kv_indptr": "*i32", "kv_indices": "*i32",
                 "mask_ptr": "*u8", "mask_indptr": "*i64", "sm_scale": "fp32"}
    rows = []
    for key, (_title, hq, hkv, dim, width) in SHAPES.items():
        bm, bn, warps = SGLANG_HOPPER[dim]
        for masked in (False, True):
            const = dict(SLIDING_WINDOW_SIZE=-1, logit_cap=0.0, xai_temperature_len=-1, Lq=dim, Lv=dim,
                         BLOCK_DMODEL=dim, BLOCK_DPE=0, BLOCK_DV=dim, BLOCK_M=bm, BLOCK_N=bn, USE_CUSTOM_MASK=masked,
                         IS_CAUSAL=True, SKIP_PREFIX_CUSTOM_MASK=True, STORE_LSE=False, SKIP_PREFIX=False,
                         SKIP_EXTEND=False, STORE_TRANSPOSE=False, HAS_SINK=False, PAGE_SIZE=1, SCORE_MOD=None)
            types_ = {n: sg_types.get(n, "*bf16" if n[0].isupper() else "i32") for n in theirs.arg_names}
            rep = compile_for_hopper(theirs, const, types_, warps)
            rows.append(dict(shape=key, kernel="sglang-mask" if masked else "sglang-causal",
                             tiles=f"{bm}x{bn}", warps=warps, **rep))
            progress(json.dumps(rows[-1]))
        for splits in (1, 16):
            cfg = ours.plan(1, hq, hkv, dim, width, torch.device("cpu"), splits)
            const = dict(G=hq // hkv, N=width, HG=cfg["heads"], RB=cfg["row_blocks"], D=dim, DV=dim,
                         BLOCK_D=cfg["block_d"], BLOCK_DV=cfg["block_d"], BLOCK_M=cfg["block_m"],
                         BLOCK_N=cfg["block_n"], SPLITS=splits)
            types_ = {n: our_types.get(n, "*bf16" if n[0].isupper() else "i32") for n in ours._tree_attn_kernel.arg_names}
            rep = compile_for_hopper(ours._tree_attn_kernel, const, types_, cfg["warps"])
            rows.append(dict(shape=key, kernel=f"ddtree (splits {splits})", tiles=f"{cfg['block_m']}x{cfg['block_n']}",
                             warps=cfg["warps"], **rep))
            progress(json.dumps(rows[-1]))
    return rows, wheel


def markdown(result: dict) -> str:
    lines = ["# Register spills of the verify attention kernels on Hopper (sm_90a, ptxas)", "",
             f"`{result['command']}` — Triton {result['triton']} compiling for sm_90a on the CPU, ptxas's report; "
             f"SGLang's kernel from `{result['sglang_wheel']}`. Static: registers and spills per thread, not speed.", "",
             "| shape | kernel | tile (rows x keys) | warps | registers | spill bytes |", "|---|---|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {SHAPES[r['shape']][0]} | {r['kernel']} | {r['tiles']} | {r['warps']} | {r['registers']} | "
                     f"{r['spill_bytes']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sglang", default="0.5.17", help="the SGLang release whose kernel is read (default 0.5.17)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        print(f"bench_attention_spills: --out {out}: no such folder", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        print(f"bench_attention_spills: this triton has no ptxas at {ptxas} (an NVIDIA build is needed)",
              file=sys.stderr)
        return 2
    rows, wheel = measure(args.sglang)
    result = dict(command=" ".join([COMMAND] + (argv if argv is not None else sys.argv[1:])), triton=triton.__version__,
                  sglang_wheel=wheel, rows=rows)
    (out / "verify-attention-spills.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "verify-attention-spills.md").write_text(markdown(result))
    print(f"wrote {out}/verify-attention-spills.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
