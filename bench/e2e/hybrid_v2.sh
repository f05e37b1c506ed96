#!/bin/bash
# Issue #15's / #24's GPU proof on SGLang 0.5.17 (hybrid GatedDeltaNet targets through the DDTree runtime's tree
# kernels, on by default: no flag beside the budget), one command per part, each within gpu_run.sh's time budget:
#   kernels   tests/gpu/test_hybrid_v2_kernels_gpu.py: the wired verify + commit at Qwen3.6-27B's GDN shapes, budgets
#             1/16/64/256, batch up to 16, against float64 per-path recurrences (runs beside the configurations)
#   lossless  the hyblive models (bench/e2e/models/mk_hybrid_live.py): DDTree b4/b16/b64 vs the stock V2 chain vs plain
#             decoding (and plain decoding with the chain verify kernel's math, `arv`, and with DDTree's tree
#             kernels' math, `ard`, in part `ard`), greedy batches 1/4/16, eager and CUDA graphs, radix cache on with
#             the extra_buffer mamba strategy
#   ard       the smallest run of the lossless proof (one GPU, three engines, no kernel check): plain decoding with
#             DDTree's tree-kernel math vs DDTree b4 and b16 with the recurrent GDN verify (-rec, the form ard is
#             bit-identical to), eager (bench/results/hybrid-0.5.17-h200-ties.md says why)
#   chunk     the default chunk-form GDN verify against the stock V2 chain: chain, DDTree b4/b16 eager and b64 with
#             graphs; every disagreement then recomputed off the GPU (python -m bench.e2e.tie_gaps --set hyblive)
#   gputests  TRITON_INTERPRET=0 pytest -m gpu tests/gpu with the bundle + overlay on the path ($OUT/gputests.log,
#             $OUT/gputests.xml); the 0.5.11-only checks skip naming what they need
#   q36       the Qwen3.6-27B shape (dummy weights) + the z-lab Qwen3.6-27B-DFlash drafter shape: round milliseconds
#             of the chain and DDTree b16/b32/b64/b128 at batch 1/8/16 where the per-node states fit (max running
#             requests 16/16/8/4/1), and the profiler's GatedDeltaNet-verify share of the round
#   q36t1/q36t2  the same round table without the profiler, E2E_SPEED_REPS (default 8) short reps per batch, in two
#             commands of one lease, every configuration at 16 max running requests (the chunk-form verify's
#             per-node records fit there up to b128): chain (pass 1), b16, b32 | b64, b128, chain (pass 2): the chain measured at both
#             ends bounds the drift between the configurations (the report merges the passes, showing each median)
#   prof36    the 27B shapes with the controlled acceptance profile (models/mk_profile.py): chain, b16, b64 sampled at
#             T = 1, so tok/s (not only round cost) is measured against the chain
# Usage (repo root; the 0.5.17 bundle at .e2e17/ with the overlay built into .e2e17/overlay by
# `ddtree-deploy patchset build ddtree --base sglang==0.5.17 --out .e2e17/overlay`):
#   bash bench/e2e/hybrid_v2.sh TAG all        # 4 GPUs (E2E_GPUS=0,1,2,3 by default): everything at once
#   bash bench/e2e/hybrid_v2.sh TAG lossless   # one GPU: kernels + lossless
#   bash bench/e2e/hybrid_v2.sh TAG ard        # one GPU: hyblive-ard vs DDTree b4/b16 (eager, recurrent GDN verify)
#   bash bench/e2e/hybrid_v2.sh TAG chunk      # one GPU: stock chain vs DDTree b4/b16 (eager) and b64 (graphs)
#   bash bench/e2e/hybrid_v2.sh TAG gputests   # one GPU: the GPU test files under pytest
#   bash bench/e2e/hybrid_v2.sh TAG q36a       # one GPU: chain, b16, b32 at the 27B shape (profiled)
#   bash bench/e2e/hybrid_v2.sh TAG q36b       # one GPU: b64, b128 at the 27B shape (profiled)
#   bash bench/e2e/hybrid_v2.sh TAG q36t1      # one GPU: chain (p1), b16, b32 (8 reps, no profiler)
#   bash bench/e2e/hybrid_v2.sh TAG q36t2      # one GPU: b64, b128, chain (p2)
#   bash bench/e2e/hybrid_v2.sh TAG q36c       # one GPU: chain, b16, b64 (8 reps, no profiler): the done-when trio in one command
#   bash bench/e2e/hybrid_v2.sh TAG prof36     # one GPU: the controlled pair, chain, b16, b64
# then: python -m bench.e2e.report hybrid-v2 bench/results/hybrid-0.5.17-h200 $OUT/*-raw.tgz
# E2E_DRY_RUN=1 runs the flow on CPU with stand-in engines (gpu_run.sh); E2E_DRY_SGLANG=PYTHONPATH (a patched tree and its
# CPU dependencies, as tests/sglang_v2/v2_helpers.run_python lays them out) adds the kernel check
# CPU smoke against a patched tree. bench/e2e/README.md has the one-lease plan (parts ard, q36t1, q36t2, gputests).
set -u
TAG=$1; PART=${2:-all}
LOSSLESS=hyblive-ar,hyblive-arv,hyblive-chain,hyblive-ddtree-b4,hyblive-ddtree-b16,hyblive-ddtree-b64
LOSSLESS=$LOSSLESS,hyblive-ar-graph,hyblive-arv-graph,hyblive-chain-graph,hyblive-ddtree-b4-graph,hyblive-ddtree-b16-graph
LOSSLESS=$LOSSLESS,hyblive-ddtree-b64-graph
Q36A=q36-chain-graph-mrr16-prof,q36-ddtree-b16-graph-mrr16-prof,q36-ddtree-b32-graph-mrr8-prof
Q36B=q36-ddtree-b64-graph-mrr4-prof,q36-ddtree-b128-graph-mrr1-prof
Q36T1=q36-chain-graph-mrr16-p1,q36-ddtree-b16-graph-mrr16,q36-ddtree-b32-graph-mrr16
Q36T2=q36-ddtree-b64-graph-mrr16,q36-ddtree-b128-graph-mrr16,q36-chain-graph-mrr16-p2
Q36C=q36-chain-graph-mrr16-p1,q36-ddtree-b16-graph-mrr16,q36-ddtree-b64-graph-mrr16
PROF36=prof36-chain-graph-mrr16,prof36-ddtree-b16-graph-mrr16,prof36-ddtree-b64-graph-mrr4
export E2E_BASE=0.5.17 E2E_SPEED_BATCHES=${E2E_SPEED_BATCHES:-1,8,16} E2E_SPEED_TOKENS=${E2E_SPEED_TOKENS:-64}
export E2E_SPEED_PROMPT_LEN=${E2E_SPEED_PROMPT_LEN:-512} E2E_PROF_BATCHES=${E2E_PROF_BATCHES:-1,8,16}
export E2E_PROF_TOKENS=${E2E_PROF_TOKENS:-32} E2E_GRAPH_MAX_BS=${E2E_GRAPH_MAX_BS:-16} E2E_WORKERS=${E2E_WORKERS:-6}
SEQUENTIAL=0
case "$PART" in
  all) export E2E_GPUS=${E2E_GPUS:-0,1,2,3} E2E_KERNEL_CHECK=1; CONFIGS=$Q36A,$Q36B,$LOSSLESS ;;
  lossless) export E2E_KERNEL_CHECK=1; CONFIGS=$LOSSLESS ;;
  ard) CONFIGS=hyblive-ard,hyblive-ddtree-b4-rec,hyblive-ddtree-b16-rec ;;
  chunk) CONFIGS=${E2E_CHUNK_CONFIGS:-hyblive-chain,hyblive-ddtree-b4,hyblive-ddtree-b16,hyblive-ddtree-b64-graph} ;;
  gputests) CONFIGS= ;;
  q36a) CONFIGS=$Q36A; SEQUENTIAL=1 ;;
  q36b) CONFIGS=$Q36B; SEQUENTIAL=1 ;;
  q36t1) CONFIGS=$Q36T1; SEQUENTIAL=1; export E2E_SPEED_REPS=${E2E_SPEED_REPS:-8} ;;
  q36t2) CONFIGS=$Q36T2; SEQUENTIAL=1; export E2E_SPEED_REPS=${E2E_SPEED_REPS:-8} ;;
  q36c) CONFIGS=$Q36C; SEQUENTIAL=1; export E2E_SPEED_REPS=${E2E_SPEED_REPS:-8} ;;
  prof36) CONFIGS=$PROF36; SEQUENTIAL=1; export E2E_SPEED_REPS=${E2E_SPEED_REPS:-8} ;;
  *) echo "part must be all, lossless, ard, chunk, gputests, q36a, q36b, q36t1, q36t2, q36c or prof36, got $PART" >&2; exit 2 ;;
esac
if [ "$PART" = gputests ]; then
  OUT=${OUT:-$PWD/e2e-out}; mkdir -p "$OUT"
  E2E_SETUP_ONLY=1 bash bench/e2e/gpu_run.sh "$TAG" "" > "$OUT/gputests-setup.log" 2>&1 || { tail "$OUT/gputests-setup.log"; exit 1; }
  tail -2 "$OUT/gputests-setup.log"
  python3 -m pytest --version > /dev/null 2>&1 || { echo "no pytest for python3 here"; exit 3; }
  CONF=()  # tests/conftest.py needs the project's own dependencies (PyYAML ...): without them, run without it
  python3 -c "import ddtree_deploy.inventory, ddtree_deploy.sandbox" > /dev/null 2>&1 \
    || { CONF=(--noconftest); echo "tests/conftest.py's imports are missing here: --noconftest (skips stay skips)"; }
  PYTEST=(python3 -m pytest -p no:cacheprovider -q "${CONF[@]}" -rs -m gpu tests/gpu --junitxml="$OUT/gputests.xml")
  if [ "${E2E_DRY_RUN:-0}" = 1 ]; then  # CPU: what would run, and that it collects
    echo "dry run: TRITON_INTERPRET=0 PYTHONPATH=/tmp/overlay:/tmp/site:$PWD/.e2e17/shim ${PYTEST[*]}"
    TRITON_INTERPRET=0 python3 -m pytest -p no:cacheprovider -q "${CONF[@]}" --collect-only -m gpu tests/gpu \
      > "$OUT/gputests.log" 2>&1; RC=$?
  else
    ldconfig -p | grep -q 'libnuma.so.1 ' || export LD_LIBRARY_PATH=$PWD/.e2e17/numa${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    TRITON_INTERPRET=0 PYTHONPATH=/tmp/overlay:/tmp/site:$PWD/.e2e17/shim SGLANG_IS_FLASHINFER_AVAILABLE=false \
      timeout "${E2E_BUDGET:-540}" "${PYTEST[@]}" > "$OUT/gputests.log" 2>&1; RC=$?
  fi
  tail -15 "$OUT/gputests.log"; echo "gputests rc=$RC"; exit $RC
fi
# q36 / prof36 parts on one GPU run their servers one after another (each needs most of the GPU): the sequential phase
if [ "$SEQUENTIAL" = 1 ]; then
  E2E_SEQ_RESERVE=0 E2E_SEQ_DEADLINE=${E2E_SEQ_DEADLINE:-470} E2E_BUDGET=${E2E_BUDGET:-490} bash bench/e2e/gpu_run.sh "$TAG" "" "$CONFIGS"
else
  E2E_BUDGET=${E2E_BUDGET:-490} E2E_DEADLINE=${E2E_DEADLINE:-460} bash bench/e2e/gpu_run.sh "$TAG" "$CONFIGS"
fi
