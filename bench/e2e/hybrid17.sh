#!/bin/bash
# Issue #15's GPU proof on SGLang 0.5.17 (hybrid GatedDeltaNet targets through the DDTree runtime's tree kernels), one
# command per part, each within gpu_run.sh's time budget:
#   kernels   tests/gpu/test_hybrid_v2_kernels_gpu.py: the wired verify + commit at Qwen3.6-27B's GDN shapes, budgets
#             1/16/64/256, batch up to 16, against float64 per-path recurrences (runs beside the configurations)
#   lossless  the hyblive models (bench/e2e/models/mk_hybrid_live.py): DDTree b4/b16/b64 vs the stock V2 chain vs plain
#             decoding (and plain decoding with the chain verify kernel's math, `arv`, and with DDTree's tree
#             kernels' math, `ard`, in part `ard`), greedy batches 1/4/16, eager and CUDA graphs, radix cache on with
#             the extra_buffer mamba strategy
#   ard       the smallest run of the lossless proof (one GPU, three engines, no kernel check): plain decoding with
#             DDTree's tree-kernel math vs DDTree b4 and b16, eager (bench/results/hybrid-0.5.17-h200-ties.md says why)
#   q36       the Qwen3.6-27B shape (dummy weights) + the z-lab Qwen3.6-27B-DFlash drafter shape: round milliseconds
#             of the chain and DDTree b16/b32/b64/b128 at batch 1/8/16 where the per-node states fit (max running
#             requests 16/16/8/4/1), and the profiler's GatedDeltaNet-verify share of the round
# Usage (repo root; the 0.5.17 bundle at .e2e17/ with the overlay built into .e2e17/overlay by
# `ddtree-deploy patchset build ddtree --base sglang==0.5.17 --out .e2e17/overlay`):
#   bash bench/e2e/hybrid17.sh TAG all        # 4 GPUs (E2E_GPUS=0,1,2,3 by default): everything at once
#   bash bench/e2e/hybrid17.sh TAG lossless   # one GPU: kernels + lossless
#   bash bench/e2e/hybrid17.sh TAG ard        # one GPU: hyblive-ard vs DDTree b4/b16 (eager)
#   bash bench/e2e/hybrid17.sh TAG q36a       # one GPU: chain, b16, b32 at the 27B shape
#   bash bench/e2e/hybrid17.sh TAG q36b       # one GPU: b64, b128 at the 27B shape
# then: python -m bench.e2e.report hybrid17 bench/results/hybrid-0.5.17-h200 $OUT/*-raw.tgz
# E2E_DRY_RUN=1 runs the flow on CPU with stand-in engines (gpu_run.sh); E2E_DRY_SGLANG=PYTHONPATH (a patched tree and its
# CPU dependencies, as tests/sglang_v2/v2_helpers.run_python lays them out) adds the kernel check
# CPU smoke against a patched tree.
set -u
TAG=$1; PART=${2:-all}
LOSSLESS=hyblive-ar,hyblive-arv,hyblive-chain,hyblive-ddtree-b4,hyblive-ddtree-b16,hyblive-ddtree-b64
LOSSLESS=$LOSSLESS,hyblive-ar-graph,hyblive-arv-graph,hyblive-chain-graph,hyblive-ddtree-b4-graph,hyblive-ddtree-b16-graph
LOSSLESS=$LOSSLESS,hyblive-ddtree-b64-graph
Q36A=q36-chain-graph-mrr16-prof,q36-ddtree-b16-graph-mrr16-prof,q36-ddtree-b32-graph-mrr8-prof
Q36B=q36-ddtree-b64-graph-mrr4-prof,q36-ddtree-b128-graph-mrr1-prof
export E2E_BASE=0.5.17 E2E_SPEED_BATCHES=${E2E_SPEED_BATCHES:-1,8,16} E2E_SPEED_TOKENS=${E2E_SPEED_TOKENS:-64}
export E2E_SPEED_PROMPT_LEN=${E2E_SPEED_PROMPT_LEN:-512} E2E_PROF_BATCHES=${E2E_PROF_BATCHES:-1,8,16}
export E2E_PROF_TOKENS=${E2E_PROF_TOKENS:-32} E2E_GRAPH_MAX_BS=${E2E_GRAPH_MAX_BS:-16} E2E_WORKERS=${E2E_WORKERS:-6}
case "$PART" in
  all) export E2E_GPUS=${E2E_GPUS:-0,1,2,3} E2E_KERNEL_CHECK=1; CONFIGS=$Q36A,$Q36B,$LOSSLESS ;;
  lossless) export E2E_KERNEL_CHECK=1; CONFIGS=$LOSSLESS ;;
  ard) CONFIGS=hyblive-ard,hyblive-ddtree-b4,hyblive-ddtree-b16 ;;
  q36a) CONFIGS=$Q36A ;;
  q36b) CONFIGS=$Q36B ;;
  *) echo "part must be all, lossless, ard, q36a or q36b, got $PART" >&2; exit 2 ;;
esac
# q36 parts on one GPU run their servers one after another (each needs most of the GPU): the sequential phase
if [ "$PART" = q36a ] || [ "$PART" = q36b ]; then
  E2E_SEQ_RESERVE=0 E2E_SEQ_DEADLINE=${E2E_SEQ_DEADLINE:-470} E2E_BUDGET=${E2E_BUDGET:-490} bash bench/e2e/gpu_run.sh "$TAG" "" "$CONFIGS"
else
  E2E_BUDGET=${E2E_BUDGET:-490} E2E_DEADLINE=${E2E_DEADLINE:-460} bash bench/e2e/gpu_run.sh "$TAG" "$CONFIGS"
fi
