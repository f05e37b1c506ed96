#!/bin/bash
# The proof runs the product: on the GPU machine, ddtree-deploy takes that machine as a host (`connection: local`)
# and deploys DDTree onto the real SGLang 0.5.17 installed there, with the real server as a managed process:
#   hosts check -> snapshot -> abi -> patchset check -> apply (generation baseline with DDTree off, push, switch,
#   restart, probe: overlay in use, GPU self-test, start-up, generation) -> probe -> apply a broken overlay (the probe
#   fails fast, rolled back) -> probe -> releases -> server stop.
# Usage (repo root, offline 0.5.17 bundle in .e2e17/): bash bench/e2e/apply_on_gpu.sh
#   E2E_BASE=0.5.N: the bundle in .e2eN/ (bench/e2e/mk_bundle.sh) and the broken fixture of that base. Bases after
#   0.5.17 pin torch 2.13 and the H200 has torch 2.11: `apply` must refuse (exit 4, the patch set's torch
#   requirement against the host's torch); `abi` of the host alone warns and the deploy is then made with `--ignore-abi`, which the journal records (abi_ignored=True);
#   SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 in the environment is passed on to the server (the kernel library stays
#   0.4.5 in those bundles: bench/results/sglang-0.5.18-h200-notes.md).
#   APPLY_SERVER=refengine: a CPU rehearsal of the same flow (the sandbox's reference engine serves instead of SGLang).
# Writes $OUT/apply-transcript.txt (every command, its exit code and seconds, its output) and apply-transcript.json.
set -u
BASE=${E2E_BASE:-0.5.17}
REPO=$PWD; B=$REPO/.e2e${BASE##*.}; OUT=${OUT:-$REPO/e2e-out}; mkdir -p "$OUT"
SERVER=${APPLY_SERVER:-sglang}
MODELS=${APPLY_MODELS:-/tmp/models}  # where the agree models are made (another run on the machine may use /tmp/models)
W=${APPLY_WORK:-/tmp/ddtree-gpu-host}; rm -rf "$W"; mkdir -p "$W/inv" "$W/store"
SITE=$W/sglang-site                                  # the "installed" SGLang the product must never modify
PY=$(command -v python3)
T0=$(date +%s)
WHEELS=${APPLY_WHEELS:-$B/wheels/*.whl}
# SGLang's own switches the run sets, passed on to the server the product starts (bench/results/sglang-0.5.21-h200-notes.md)
PASS_ENV="SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
# ddtree-deploy's own pure-Python dependencies the GPU image lacks (bench/e2e/mk_bundle.sh puts them in tool-wheels/)
if ls "$B"/tool-wheels/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/tool-site" "$B"/tool-wheels/*.whl \
    $(ls "$B"/wheels/pydantic-*.whl "$B"/wheels/pydantic_core-*.whl "$B"/wheels/annotated_types-*.whl \
         "$B"/wheels/typing_inspection-*.whl 2>/dev/null) || exit 1
  export PYTHONPATH=$W/tool-site${PYTHONPATH:+:$PYTHONPATH}
fi  # the rehearsal passes this machine's sglang 0.5.17 wheel alone
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $WHEELS || exit 1
export DDTREE_INVENTORY=$W/inv DDTREE_SNAPSHOTS=$W/store DDTREE_PATCHES=$REPO/patches PYTHONUNBUFFERED=1 COLUMNS=120
if [ "$SERVER" = refengine ]; then
  python3 -c "import sys; from pathlib import Path; from ddtree_deploy.sandbox import copy_refengine; copy_refengine(Path(sys.argv[1]))" "$SITE"
  CMD='{python} -m ddtree_refengine --host {host} --port {port} {ddtree_flags}'
  FLAGS='--speculative-algorithm DFLASH --speculative-ddtree-budget 15'
else
  python3 -m bench.e2e.models.mk_models $MODELS > "$W/models.log" 2>&1 && python3 -m bench.e2e.models.mk_agree $MODELS $MODELS >> "$W/models.log" 2>&1 || { tail "$W/models.log"; exit 2; }
  CMD="{python} -m sglang.launch_server --model-path $MODELS/agree-qwen3 --attention-backend triton --sampling-backend pytorch --grammar-backend none --mem-fraction-static ${APPLY_MEM_FRACTION:-0.25} --mm-feature-transport cpu --cuda-graph-max-bs-decode 8 --host {host} --port {port} {ddtree_flags}"
  FLAGS="--speculative-algorithm DFLASH --speculative-draft-model-path $MODELS/agree-dflash --speculative-draft-attention-backend triton --speculative-ddtree-budget 15"
fi
cat > "$W/inv/gpu.yaml" <<EOF
name: gpu
description: the GPU machine itself (connection local), sglang $BASE installed under $SITE
connection: local
command_timeout: 600
python: $PY
site_packages: $SITE
release_root: $W/ddtree
server:
  kind: managed
  command: "$CMD"
  ddtree_flags: "$FLAGS"
  host: 127.0.0.1
  port: 30011
  env:
    PYTHONPATH: "$SITE:$B/shim"
    SGLANG_IS_FLASHINFER_AVAILABLE: "false"
    HF_HUB_OFFLINE: "1"
    TRANSFORMERS_OFFLINE: "1"$(for v in $PASS_ENV; do [ -n "${!v:-}" ] && printf '\n    %s: "%s"' "$v" "${!v}"; done)
probe:
  startup_timeout: 300
  generation_timeout: 120
  prompts:
    - "the quick brown fox"
    - "hello world, this is"
  max_new_tokens: 32
EOF
mkdir -p "$W/ddtree"
TX=$OUT/apply-transcript.txt; : > "$TX"; STEPS=$W/steps.jsonl; : > "$STEPS"
step() {  # step EXPECTED_RC command...
  local want=$1; shift
  local t=$(date +%s.%N)
  { echo "\$ ddtree-deploy $*"; } >> "$TX"
  python3 -m ddtree_deploy "$@" > "$W/out.txt" 2>&1; local rc=$?
  local dt=$(python3 -c "import time; print(round(time.time() - $t, 1))")
  cat "$W/out.txt" >> "$TX"; echo "[exit $rc, ${dt} s]" >> "$TX"; echo >> "$TX"
  python3 - "$*" "$want" "$rc" "$dt" >> "$STEPS" <<'PY'
import json, sys
print(json.dumps({"command": "ddtree-deploy " + sys.argv[1], "expected_exit": int(sys.argv[2]), "exit": int(sys.argv[3]),
                  "seconds": float(sys.argv[4])}))
PY
  echo "== ddtree-deploy $* -> exit $rc (${dt} s; expected $want)"
}
BEFORE=$(cd "$SITE" && find sglang -type f -name '*.py' | sort | xargs sha256sum | sha256sum | cut -c1-16)
# Does the host's torch meet the base's pin? (0.5.18+ on the H200: no, and abi / apply must say so)
ABI_RC=$(python3 -c "
import sys; sys.path.insert(0, '$SITE')
from importlib.metadata import distribution
from packaging.requirements import Requirement
import torch
have = torch.__version__.split('+')[0]
for r in distribution('sglang').requires or []:
    q = Requirement(r)
    if q.name == 'torch' and not q.marker and q.specifier and not q.specifier.contains(have, prereleases=True):
        print(4); break
else:
    print(0)
" 2>/dev/null || echo 0)
IGNORE=; [ "$ABI_RC" = 0 ] || IGNORE=--ignore-abi
step 0 hosts check gpu
step 0 snapshot gpu
# the host alone: where the bundle keeps 0.5.17's sglang-kernel 0.4.5 under a newer sglang, companion-pins is an error
step "$ABI_RC" abi gpu
step 0 patchset check ddtree --snapshot gpu
[ "$ABI_RC" = 0 ] || step "$ABI_RC" apply --host gpu
step 0 apply --host gpu $IGNORE
step 0 probe gpu
# the broken fixture has no series, so its release's SGLang does not know DDTree's flags: the launch check refuses the
# line before the switch (exit 2) and removes the pushed release; nothing is restarted (before the check: exit 1,
# the probe failing fast and rolling back, as in sglang-0.5.17-h200-apply-transcript)
step 2 apply --host gpu $IGNORE --patchset "$REPO/tests/patchsets/broken-runtime/sglang-$BASE"
step 0 probe gpu
step 0 releases gpu
step 0 server stop gpu
AFTER=$(cd "$SITE" && find sglang -type f -name '*.py' | sort | xargs sha256sum | sha256sum | cut -c1-16)
echo "installed package digest before $BEFORE after $AFTER" | tee -a "$TX"
python3 - "$STEPS" "$TX" "$BEFORE" "$AFTER" "$SERVER" "$(( $(date +%s) - T0 ))" > "$OUT/apply-transcript.json" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(json.dumps({"server": sys.argv[5], "steps": steps, "all_as_expected": all(s["exit"] == s["expected_exit"] for s in steps),
                  "installed_package_unchanged": sys.argv[3] == sys.argv[4], "total_seconds": int(sys.argv[6]),
                  "text": open(sys.argv[2]).read()}, indent=1))
PY
grep -c . "$TX" > /dev/null; tail -c 6000 "$TX"
python3 -c "import json,sys; d=json.load(open('$OUT/apply-transcript.json')); print('all as expected:', d['all_as_expected'], 'package unchanged:', d['installed_package_unchanged'], 'total', d['total_seconds'], 's')"
