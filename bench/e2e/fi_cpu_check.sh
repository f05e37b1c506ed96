#!/bin/bash
# CPU checks of the FlashInfer bundle (.e2e17fi, bench/e2e/mk_bundle_flashinfer.sh) before a GPU call.
# Usage (repo root): bash bench/e2e/fi_cpu_check.sh PYTHON [WORKDIR]
#   PYTHON: a Python 3.12 whose packages mimic the GPU image: python3.12 -m venv V && V/bin/pip install -r
#           ../shared/gpu-e2e-0.5.17/cpu-check/image-like-requirements.txt, then `V/bin/pip uninstall pydantic
#           pydantic_core annotated-types typing-inspection` (typer pulls them in; the image has none of them).
# Env: E2E_BUNDLE (default .e2e17fi), SRC (the 0.5.17 bundle, default ../shared/gpu-e2e-0.5.17: its cpu-check/fake_cuda.py
#      and its full transformers wheel for the registry comparison), FI_JIT=0 skips step 7 (minutes on 2 cores).
# Steps (each prints ok/FAIL lines; the exit status is non-zero when one fails):
#   1. pip install --no-index --no-deps --target WORKDIR/site of the bundle's wheels (as gpu_run.sh does), the overlay
#      laid over a copy of sglang (WORKDIR/overlay); every shared library's NEEDED entries resolve (ldd);
#   2. plain CPU imports of flashinfer and the serving modules, in a network namespace with no network (unshare -rn);
#   3. the same under fake CUDA (sm90 H200): SGLang's CUDA branches run, is_flashinfer_available() is true, the
#      FlashInfer backend binds the real wrappers; plus every in-function import of that backend and of the flashinfer
#      modules it loaded;
#   4. SGLang's model registry with the bundle's trimmed transformers against the 0.5.17 bundle's full one: the
#      architectures the trim costs (none of them served here);
#   5. the e2e model makers (mk_models, mk_agree) with the trimmed transformers;
#   6. the driver's -fi / -fiv configurations resolved by SGLang's ServerArgs with the DDTree overlay (its refusals);
#   7. FlashInfer's JIT modules on the backend's path compiled (not run) for sm_90a with the local nvcc, through
#      bench/e2e/fi_env.sh as on the GPU (needs nvcc; the driver library is a stub here).
set -u
PY=$1; W=${2:-$(mktemp -d)}; mkdir -p "$W"; W=$(cd "$W" && pwd)
B=${E2E_BUNDLE:-.e2e17fi}; SRC=${SRC:-../shared/gpu-e2e-0.5.17}; SRC=$(cd "$SRC" && pwd)
[ -d "$B/wheels" ] || { echo "no bundle at $B (bash bench/e2e/mk_bundle_flashinfer.sh)"; exit 2; }
RC=0
fail() { echo "FAIL $*"; RC=1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1
unset SGLANG_IS_FLASHINFER_AVAILABLE
echo "== 1. install, overlay, shared libraries"
rm -rf "$W/site" "$W/overlay"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" "$B"/wheels/*.whl 2>&1 \
  | grep -v "^WARNING: Location" | grep . && fail "pip install printed the above"
mkdir -p "$W/overlay" && cp -r "$W/site/sglang" "$W/overlay/" && cp -r "$B"/overlay/sglang/. "$W/overlay/sglang/"
for d in "$B"/overlay/*.dist-info; do [ -d "$d" ] && cp -r "$d" "$W/overlay/"; done
echo "installed $(ls "$W/site" | grep -c dist-info) distributions into $W/site; flashinfer data/: $(du -sh "$W/site/flashinfer/data" | cut -f1)"
mkdir -p "$W/fakecuda"  # a stub libcuda.so.1 (the 0.5.17 check's symbols), for sgl_kernel under fake CUDA and the JIT's link
for s in cuPointerGetAttribute cuCtxFromGreenCtx cuCtxPopCurrent_v2 cuCtxPushCurrent_v2 cuDevResourceGenerateDesc \
  cuDevSmResourceSplitByCount cuDeviceGetDevResource cuDriverGetVersion cuGetErrorString cuGetProcAddress_v2 \
  cuGreenCtxCreate cuGreenCtxDestroy cuGreenCtxGetDevResource cuStreamCreate cuInit cuDeviceGet cuDeviceGetCount \
  cuGetProcAddress; do echo "int $s(void){return 100;}"; done > "$W/fakecuda/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$W/fakecuda/libcuda.so.1" "$W/fakecuda/stub.c" || fail "stub libcuda"
TL=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__) + "/lib")')
NV=$("$PY" -c 'import glob, nvidia; print(":".join(sorted(set(glob.glob(nvidia.__path__[0] + "/*/lib")))))')
NF=$(find "$W/site" -name "*.so*" -type f | while read -r f; do
  LD_LIBRARY_PATH=$TL:$NV:$W/fakecuda:$(dirname "$f") ldd "$f" 2>/dev/null | grep "not found" | sed "s|^|${f#"$W"/site/}: |"
done)
[ -z "$NF" ] && echo "ok   every NEEDED library of $(find "$W/site" -name "*.so*" -type f | wc -l) shared objects resolves" \
  || fail "unresolved libraries: $NF"
MODS="flashinfer flashinfer.prefill flashinfer.decode flashinfer.cascade flashinfer.jit.core sglang.srt.server_args
  sglang.launch_server sglang.srt.entrypoints.engine sglang.srt.entrypoints.http_server sglang.srt.managers.scheduler
  sglang.srt.managers.tokenizer_manager sglang.srt.managers.detokenizer_manager sglang.srt.model_executor.model_runner
  sglang.srt.models.qwen3 sglang.srt.models.dflash sglang.srt.layers.attention.flashinfer_backend
  sglang.srt.layers.attention.triton_backend sglang.srt.layers.attention.attention_registry
  sglang.srt.speculative.draft_utils sglang.srt.speculative.dflash_worker_v2 sglang.srt.layers.sampler
  sglang.srt.layers.layernorm sglang.srt.speculative.ddtree_v2.round"
PP=$W/overlay:$W/site:$PWD/$B/shim:$PWD
echo "== 2. plain CPU imports, no network"
PYTHONPATH=$PP unshare -rn "$PY" -m bench.e2e.fi_cpu_check imports $MODS 2>&1 | grep -E "^(ok|FAIL)|^is_flash|^flashinfer_|^third" \
  | tee "$W/imports-plain.log"; grep -q "^FAIL" "$W/imports-plain.log" && RC=1
echo "== 3. fake-CUDA (sm90) imports, no network"
export LD_LIBRARY_PATH=$W/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PYTHONPATH=$SRC/cpu-check:$PP unshare -rn "$PY" -m bench.e2e.fi_cpu_check imports --fake $MODS 2>&1 \
  | grep -E "^(ok|FAIL)|^is_flash|^flashinfer_|^third" | tee "$W/imports-fake.log"
grep -q "^FAIL" "$W/imports-fake.log" && RC=1
grep -q "^is_flashinfer_available(): True" "$W/imports-fake.log" || fail "is_flashinfer_available() is not true under fake CUDA"
PYTHONPATH=$SRC/cpu-check:$PP unshare -rn "$PY" -m bench.e2e.fi_cpu_check lazy --fake > "$W/lazy.log" 2>&1
grep -E "^(FAIL|lazy)" "$W/lazy.log"
echo "== 4. model registry: trimmed transformers against the full one"
rm -rf "$W/tf-full" && "$PY" -m pip install -q --no-index --no-deps --target "$W/tf-full" "$SRC"/wheels/transformers-*.whl 2>&1 | grep -v "^WARNING: Location"
PYTHONPATH=$SRC/cpu-check:$PP "$PY" -m bench.e2e.fi_cpu_check registry --fake "$W/archs-trim.json" 2>&1 | tail -1 | tee "$W/registry.log"
PYTHONPATH=$SRC/cpu-check:$W/tf-full:$PP "$PY" -m bench.e2e.fi_cpu_check registry --fake "$W/archs-full.json" 2>&1 | tail -1
grep -q "all there" "$W/registry.log" || RC=1
"$PY" -c 'import json, sys; a, b = (set(json.load(open(f))) for f in sys.argv[1:]); print("architectures the trim removes:", len(b - a), sorted(b - a)); print("added:", sorted(a - b))' \
  "$W/archs-trim.json" "$W/archs-full.json"
echo "== 5. model makers with the trimmed transformers"
M=$W/models; rm -rf "$M"
PYTHONPATH=$PP "$PY" -m bench.e2e.models.mk_models "$M" > "$W/mk.log" 2>&1 && PYTHONPATH=$PP "$PY" -m bench.e2e.models.mk_agree "$M" "$M" >> "$W/mk.log" 2>&1 \
  && echo "ok   mk_models, mk_agree: $(ls "$M" | tr '\n' ' ')" || { tail -5 "$W/mk.log"; fail "model makers"; }
echo "== 6. the -fi configurations' server arguments (ServerArgs with the DDTree overlay, fake CUDA)"
PYTHONPATH=$SRC/cpu-check:$PP E2E_BASE=0.5.17 "$PY" -m bench.e2e.fi_cpu_check args --fake "$M" agree-ar-graph-fi \
  agree-chain-graph-fi agree-ddtree-b15-graph-fi agree-ddtree-b15-fiv agree-ddtree-b15-graph 2>&1 | grep -E "^(agree|FAIL|DDTree)" | tee "$W/args.log"
grep -q "^FAIL" "$W/args.log" && RC=1
if [ "${FI_JIT:-1}" = 1 ]; then
  echo "== 7. FlashInfer JIT modules on the backend's path, compiled for sm_90a with the local nvcc"
  if command -v nvcc > /dev/null; then
    ( PATH=$(dirname "$PY"):$PATH; export PYTHONPATH=$PP FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$W/fi-ws MAX_JOBS=${MAX_JOBS:-2}
      . bench/e2e/fi_env.sh
      python3 -m bench.e2e.fi_cpu_check jit cascade quantization decode-hd16 prefill-fa2-hd16 decode-hd128 prefill-fa2-hd128 \
        prefill-fa3-hd128 ) 2>&1 | grep -E "^(ok|FAIL|flashinfer JIT)" | cut -c1-1500 | tee "$W/jit.log"
    grep -q "^FAIL" "$W/jit.log" && RC=1
  else
    echo "skipped: no nvcc here"
  fi
fi
echo "fi_cpu_check: $([ $RC = 0 ] && echo all passed || echo FAILED) (logs in $W)"
exit $RC
