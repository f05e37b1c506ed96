#!/bin/bash
# One device call that proves a spec-v2 base's patch set: the lossless table (bench/e2e/gpu_run.sh, the agree and
# rand model sets, eager and CUDA graphs) and, beside it on the same GPU, ddtree-deploy itself deploying onto that
# base (bench/e2e/apply_on_gpu.sh). Nothing here is timed (the lossless configurations compare output ids; the
# transcript's seconds are wall time), so the two may share the GPU; speed runs go in a call of their own.
# Usage (repo root, bundle in .e2eN/ made by bench/e2e/mk_bundle.sh 0.5.N): bash bench/e2e/base_proof.sh 0.5.N TAG
# $OUT gets at most 5 files: TAG.json, TAG-raw.tgz, expected-acceptance.json, apply-transcript.json and logs.tgz
# (setup and orchestration logs, the transcript as text, each script's output).
set -u
BASE=$1; TAG=$2
O=${OUT:-$PWD/e2e-out}; W=$O/work; rm -rf "$W"; mkdir -p "$W/apply"
export E2E_BASE=$BASE
LOSSLESS=${PROOF_CONFIGS:-agree-ar,agree-chain,agree-ddtree-b15,agree-ddtree-b15-graph,agree-ddtree-b64-graph,rand-ar,rand-chain,rand-ddtree-b15,rand-ddtree-b15-graph}
# The deploy's server uses its own models folder and a small share of the GPU, beside E2E_WORKERS engines.
( OUT=$W/apply APPLY_MODELS=/tmp/models-apply APPLY_MEM_FRACTION=${APPLY_MEM_FRACTION:-0.12} \
    bash bench/e2e/apply_on_gpu.sh > "$W/apply.log" 2>&1; echo "apply_on_gpu rc=$?" >> "$W/apply.log" ) & A=$!
OUT=$W E2E_WORKERS=${E2E_WORKERS:-5} E2E_BUDGET=${E2E_BUDGET:-540} E2E_DEADLINE=${E2E_DEADLINE:-480} \
  bash bench/e2e/gpu_run.sh "$TAG" "$LOSSLESS" > "$W/run.log" 2>&1; echo "gpu_run rc=$?" >> "$W/run.log"
wait $A
for f in "$TAG.json" "$TAG-raw.tgz" expected-acceptance.json; do [ -f "$W/$f" ] && mv "$W/$f" "$O/"; done
[ -f "$W/apply/apply-transcript.json" ] && mv "$W/apply/apply-transcript.json" "$O/"
tar czf "$O/logs.tgz" -C "$W" . && rm -rf "$W"
echo "== lossless"; tar xzf "$O/logs.tgz" -O ./run.log 2>/dev/null | grep -v "^\s*$" | tail -40
echo "== apply"; tar xzf "$O/logs.tgz" -O ./apply.log 2>/dev/null | grep -E "^== |all as expected|rc=" | tail -20
ls -la "$O"
