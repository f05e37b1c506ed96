#!/bin/bash
# On the GPU host: install the offline SGLang bundle, lay the DDTree overlay over a copy of it, make the
# models the configurations need, run the e2e configurations and write the report + logs under $OUT.
# Usage (repo root: the harness runs as `python3 -m bench.e2e.*` from there; the overlay is the product's: `ddtree-deploy patchset build ddtree --base sglang==BASE --out DIR`;
# E2E_BASE=0.5.11 (default): bundle in .e2e/, overlay in .e2e/overlay/; E2E_BASE=0.5.N (N >= 17): bundle in
# .e2eN/, overlay in .e2eN/overlay/ made by `ddtree-deploy patchset build ddtree --base sglang==0.5.N --out ...`):
#   bash bench/e2e/gpu_run.sh TAG PARALLEL_CONFIGS [SEQUENTIAL_CONFIGS]
# PARALLEL_CONFIGS run several Engine processes at once (correctness, acceptance); SEQUENTIAL_CONFIGS run one at a
# time afterwards (anything timed).
# Time: E2E_BUDGET (default 525 s) bounds the whole script; the parallel phase ends by E2E_DEADLINE (default 420 s)
# and, when there is a sequential phase, early enough to leave it E2E_SEQ_RESERVE (default 240 s); the sequential
# phase ends by E2E_SEQ_DEADLINE (default 330 s) or the budget. A configuration still running at its phase's end
# is killed (its JSON may hold a checkpoint).
# $OUT: setup.log (install + model making), orchestrate-TAG.log (ends with the setup/phase/total times), TAG.json,
# TAG.md, TAG-raw.tgz (results, logs, the agree target's weights), and for `-prof` configurations
# TAG-round-share.json (python -m bench.e2e.round_share), TAG-gdn-share.json (python -m bench.e2e.gdn_share: the
# GatedDeltaNet verify's share of the round) and TAG-prof.tgz (the traces, if under 15 MB).
# E2E_SETUP_ONLY=1: install the bundle and lay the overlay (as above), then stop (bench/e2e/hybrid_v2.sh gputests).
# E2E_GPUS=0,1,2,3: spread the configurations over these GPUs (dummy-weight model sets one per GPU on all but the first,
# the others on the first; bench/e2e/driver.py gpu_slot).
# E2E_BUNDLE=DIR: the bundle folder (relative to the repo root, or absolute) instead of the base's default. A bundle with
# a flashinfer_python wheel (.e2e17fi: bench/e2e/mk_bundle_flashinfer.sh) has the REAL FlashInfer: SGLang may use it
# (SGLANG_IS_FLASHINFER_AVAILABLE is not set to false), its JIT compiles kernels with the machine's nvcc into
# $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default /tmp/flashinfer) and never downloads (FLASHINFER_NO_DOWNLOAD=1);
# $OUT/flashinfer-jit.txt lists the modules it built and how long each took. Configurations ending in -fi / -fiv run
# --attention-backend flashinfer (driver.py).
set -u
TAG=$1; CONFIGS=$2; SEQ=${3:-}
export E2E_BASE=${E2E_BASE:-0.5.11}
if [ -n "${E2E_BUNDLE:-}" ]; then case $E2E_BUNDLE in /*) B=$E2E_BUNDLE ;; *) B=$PWD/$E2E_BUNDLE ;; esac; B=${B%/}
elif [ "$E2E_BASE" = 0.5.11 ]; then B=$PWD/.e2e; else B=$PWD/.e2e${E2E_BASE##*.}; fi
REAL_FI=0; ls "$B"/wheels/flashinfer_python-*.whl > /dev/null 2>&1 && REAL_FI=1
OUT=${OUT:-$PWD/e2e-out}; mkdir -p "$OUT"
T0=$(date +%s)
export E2E_MODELS=${E2E_MODELS:-/tmp/models}; M=$E2E_MODELS  # where the models are made; the driver reads them there
BUDGET=${E2E_BUDGET:-525}
elapsed() { echo $(( $(date +%s) - T0 )); }
needs() { echo ",$CONFIGS,$SEQ," | grep -q ",$1-"; }  # does any configuration use model set $1?
DRY=${E2E_DRY_RUN:-0}  # 1: CPU dry run (no install; bench.e2e.dry_engine stands in for sglang.Engine)
if [ "$DRY" = 1 ]; then
  echo "dry run: no install, CPU stand-in engines" > "$OUT/setup.log"; export PYTHONUNBUFFERED=1 E2E_DRY_RUN=1 E2E_OVERLAY_DIR=${E2E_OVERLAY_DIR:-/tmp/overlay}
else
# a warm machine may hold another bundle's packages in /tmp/site (the real FlashInfer would shadow a bundle's shim)
[ "$(cat /tmp/site/.e2e-bundle 2>/dev/null)" = "$B" ] || rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/wheels/*.whl > "$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
echo "$B" > /tmp/site/.e2e-bundle
rm -rf /tmp/overlay && mkdir -p /tmp/overlay && cp -r /tmp/site/sglang /tmp/overlay/ && cp -r "$B"/overlay/sglang/. /tmp/overlay/sglang/
# the overlay's plugin dist-info (patch sets with hooks: SGLang's plugin loader finds its entry point on the path)
for d in "$B"/overlay/*.dist-info; do [ -d "$d" ] && cp -r "$d" /tmp/overlay/; done
find /tmp/overlay/sglang -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null
export E2E_OVERLAY_DIR=/tmp/overlay PYTHONPATH=/tmp/overlay:/tmp/site:$B/shim PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ $REAL_FI = 1 ]; then
  . bench/e2e/fi_env.sh  # FlashInfer's JIT offline: cache under /tmp, nvcc, what it links and includes
else
  export SGLANG_IS_FLASHINFER_AVAILABLE=false  # the bundle's flashinfer is a shim
fi
ldconfig -p | grep -q 'libnuma.so.1 ' || export LD_LIBRARY_PATH=$B/numa${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ "${E2E_SETUP_ONLY:-0}" = 1 ]; then  # the bundle installed with the overlay (/tmp/site, /tmp/overlay), nothing run
  [ "$DRY" = 1 ] || python3 -c "import sglang, sglang.srt.speculative.ddtree_v2.hybrid; print('sglang', sglang.__version__, sglang.__file__)" 2>&1 | tail -2
  echo "setup only $(elapsed)s"; exit 0
fi
# Models, in the background while the imports are checked: each set only when a configuration needs it and it is
# missing (idempotent on a warm machine). tiny-qwen3 is the tokenizer base of all of them.
(
  set -e
  [ -d $M/agree-qwen3 ] || { python3 -m bench.e2e.models.mk_models $M; python3 -m bench.e2e.models.mk_agree $M $M; }
  if { needs agree64 || needs rand64; } && [ ! -d $M/agree-qwen3-hd64 ]; then  # head dim 64: FlashInfer's proofs
    python3 -m bench.e2e.models.mk_models $M 64; python3 -m bench.e2e.models.mk_agree $M $M 64; fi
  if needs big; then python3 -m bench.e2e.models.mk_big $M $M; fi
  # configs only (dummy weights): always rewritten, so a warm machine never serves an older config
  if needs q8b || needs q36; then python3 -m bench.e2e.models.mk_shapes $M $M; fi
  if needs prof || needs prof36; then python3 -m bench.e2e.models.mk_profile $M $M; fi
  if needs hyb && [ ! -d $M/tiny-next ]; then python3 -m bench.e2e.models.mk_hybrid $M $M; fi
  if needs hyblive && [ ! -d $M/live-next ]; then python3 -m bench.e2e.models.mk_hybrid_live $M $M; fi
) >> "$OUT/setup.log" 2>&1 &
MK=$!
if [ "$DRY" != 1 ]; then
if [ "$E2E_BASE" = 0.5.11 ]; then GLUE=sglang.srt.speculative.ddtree_verify; else GLUE=sglang.srt.speculative.ddtree_v2.round; fi
python3 -c "import torch, sglang, sglang.srt.speculative.ddtree as rt, $GLUE as dv; print('torch', torch.__version__, 'sglang', sglang.__version__, sglang.__file__, 'runtime', rt.__version__)" 2>&1 | tail -3
[ $REAL_FI = 1 ] && python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__, flashinfer.__file__)" 2>&1 | tail -2
python3 -m bench.e2e.expected_acceptance /tmp/overlay "$OUT/expected-acceptance.json" > /dev/null 2>&1 || echo "expected_acceptance failed"
# Byte-compile the whole overlay and bundle once (seconds on all cores) instead of in every Engine process at once.
python3 -m compileall -q -j 0 /tmp/overlay/sglang /tmp/site >/dev/null 2>&1; python3 -m compileall -q /tmp/overlay/sglang/srt/speculative /tmp/overlay/sglang/srt/server_args.py >/dev/null || echo "compileall failed"
fi
# E2E_KERNEL_CHECK=1: the 0.5.17 hybrid tree-verify check (tests/gpu/test_hybrid_v2_kernels_gpu.py) in the background
# on GPU E2E_KERNEL_GPU (default: the first of E2E_GPUS, else 0), beside the configurations; $OUT/hybrid_v2_kernels.*
KC=
if [ "${E2E_KERNEL_CHECK:-0}" = 1 ]; then
  G=${E2E_GPUS:-}; KGPU=${E2E_KERNEL_GPU:-${G%%,*}}; KGPU=${KGPU:-0}
  if [ "$DRY" = 1 ]; then  # CPU: the interpreter smoke, when a patched sglang is importable (E2E_DRY_SGLANG=PYTHONPATH)
    if [ -n "${E2E_DRY_SGLANG:-}" ]; then
      ( PYTHONPATH=$E2E_DRY_SGLANG${PYTHONPATH:+:$PYTHONPATH} python3 tests/gpu/test_hybrid_v2_kernels_gpu.py --cpu-smoke \
          --cases "${E2E_DRY_KERNEL_CASES:-b1-bs16-draft-graph-pad2}" --out "$OUT/hybrid_v2_kernels.json" \
          > "$OUT/hybrid_v2_kernels.log" 2>&1 ) & KC=$!
    else
      echo '{"skipped": "dry run: no patched sglang to import (set E2E_DRY_SGLANG)"}' > "$OUT/hybrid_v2_kernels.json"
    fi
  else
    ( CUDA_VISIBLE_DEVICES=$KGPU python3 tests/gpu/test_hybrid_v2_kernels_gpu.py --out "$OUT/hybrid_v2_kernels.json" \
        > "$OUT/hybrid_v2_kernels.log" 2>&1 ) & KC=$!
  fi
fi
wait $MK || { echo "model making failed"; tail -20 "$OUT/setup.log"; exit 3; }
grep -E "^ok " "$OUT/setup.log" | cut -c1-200
echo "setup $(elapsed)s" | tee "$OUT/orchestrate-$TAG.log"
R=/tmp/res-$TAG; mkdir -p $R
if [ -n "$CONFIGS" ]; then
  DL=${E2E_DEADLINE:-420}; LEFT=$(( BUDGET - $(elapsed) - 15 ))
  [ -n "$SEQ" ] && LEFT=$(( LEFT - ${E2E_SEQ_RESERVE:-240} ))
  [ $LEFT -lt $DL ] && DL=$LEFT
  E2E_DEADLINE=$DL python3 -m bench.e2e.driver orchestrate $R "$CONFIGS" 2>&1 | tee -a "$OUT/orchestrate-$TAG.log"
  echo "parallel phase done at $(elapsed)s (deadline ${DL}s)" | tee -a "$OUT/orchestrate-$TAG.log"
fi
if [ -n "$SEQ" ]; then
  DL=${E2E_SEQ_DEADLINE:-330}; LEFT=$(( BUDGET - $(elapsed) - 15 ))
  [ $LEFT -lt $DL ] && DL=$LEFT
  # Several may start at once (E2E_SEQ_WORKERS): their timed parts still run one at a time (the driver's speed lock).
  E2E_WORKERS=${E2E_SEQ_WORKERS:-1} E2E_DEADLINE=$DL python3 -m bench.e2e.driver orchestrate $R "$SEQ" 2>&1 | tee -a "$OUT/orchestrate-$TAG.log"
  echo "sequential phase done at $(elapsed)s (deadline ${DL}s)" | tee -a "$OUT/orchestrate-$TAG.log"
fi
if [ -n "$KC" ]; then wait $KC; echo "kernel check rc=$? at $(elapsed)s: $(tail -1 "$OUT/hybrid_v2_kernels.log" 2>/dev/null)" | tee -a "$OUT/orchestrate-$TAG.log"; fi
python3 -m bench.e2e.driver report $R "$OUT/$TAG" > /dev/null
cat "$OUT/$TAG.md"
mkdir -p $R/models && for m in agree-qwen3 big-qwen3 prof-target prof36-target; do  # small files that let the post-processing use the served weights
  [ -d $M/$m ] || continue; mkdir -p $R/models/$m; cp $M/$m/*.json $R/models/$m/ 2>/dev/null
  [ $m = agree-qwen3 ] && cp $M/$m/model.safetensors $R/models/$m/
done
if [ -d $R/prof ]; then
  python3 -m bench.e2e.round_share $R "$OUT/$TAG-round-share.json" || echo "round_share failed"
  python3 -m bench.e2e.gdn_share $R "$OUT/$TAG-gdn-share.json" || echo "gdn_share failed"
  tar cf "$OUT/$TAG-prof.tgz" -C $R prof
  [ $(stat -c %s "$OUT/$TAG-prof.tgz") -le 15000000 ] || { echo "traces too large to return: $(du -sh $R/prof)"; rm -f "$OUT/$TAG-prof.tgz"; }
fi
if [ $REAL_FI = 1 ] && [ "$DRY" != 1 ]; then  # what FlashInfer's JIT built in this call (seconds from ninja file to library)
  python3 -m bench.e2e.fi_bundle jit-times "$FLASHINFER_WORKSPACE_BASE" | tee "$OUT/flashinfer-jit.txt" | tail -12
  cp "$OUT/flashinfer-jit.txt" $R/ 2>/dev/null
fi
tar czf "$OUT/$TAG-raw.tgz" -C $R --exclude ./prof .
if grep -qh "DDTree sync check" $R/logs/*.log 2>/dev/null; then
  echo "== DDTree sync check (rounds per distinct set of synchronizing call sites)"
  grep -h "DDTree sync check" $R/logs/*.log | sed 's/.*round [0-9]*: //' | sort | uniq -c | sort -rn | head -20
fi
for f in $R/logs/*.log; do echo "== $f"; grep -E "Error|Traceback|DDTree|Exception|cuda graph" "$f" | grep -v -E "UserWarning|Ignore import error" | head -6; done 2>/dev/null | head -150
echo "total $(elapsed)s" | tee -a "$OUT/orchestrate-$TAG.log"
