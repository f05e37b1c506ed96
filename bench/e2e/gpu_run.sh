#!/bin/bash
# On the GPU host: install the offline SGLang 0.5.11 bundle, lay the DDTree overlay over a copy of it, make the
# tiny models, run the e2e configurations and write the report + logs under $OUT.
# Usage (repo root, bundle in .e2e/, overlay in .e2e/overlay/):
#   bash bench/e2e/gpu_run.sh TAG PARALLEL_CONFIGS [SEQUENTIAL_CONFIGS]
# PARALLEL_CONFIGS run several Engine processes at once (correctness, acceptance); SEQUENTIAL_CONFIGS run one at a
# time afterwards (anything timed).
set -u
TAG=$1; CONFIGS=$2; SEQ=${3:-}
B=$PWD/.e2e; OUT=${OUT:-$PWD/e2e-out}; mkdir -p "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/wheels/*.whl > "$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 1; }
rm -rf /tmp/overlay && mkdir -p /tmp/overlay && cp -r /tmp/site/sglang /tmp/overlay/ && cp -r "$B"/overlay/sglang/. /tmp/overlay/sglang/
find /tmp/overlay/sglang -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null
export PYTHONPATH=/tmp/overlay:/tmp/site:$B/shim SGLANG_IS_FLASHINFER_AVAILABLE=false PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ldconfig -p | grep -q 'libnuma.so.1 ' || export LD_LIBRARY_PATH=$B/numa${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -c "import torch, sglang, sglang.srt.speculative.ddtree as rt, sglang.srt.speculative.ddtree_verify as dv; print('torch', torch.__version__, 'sglang', sglang.__version__, sglang.__file__, 'runtime', rt.__version__)" 2>&1 | tail -3
python3 -m compileall -q /tmp/overlay/sglang/srt/speculative /tmp/overlay/sglang/srt/server_args.py /tmp/overlay/sglang/srt/model_executor/cuda_graph_runner.py >/dev/null || echo "compileall failed"
if [ ! -d /tmp/models/agree-qwen3 ]; then
  python3 "$B/mk_models.py" /tmp/models > "$OUT/models.log" 2>&1 && python3 bench/e2e/mk_agree.py /tmp/models /tmp/models >> "$OUT/models.log" 2>&1 || { tail "$OUT/models.log"; exit 3; }
fi
if [ ! -d /tmp/models/live-next ]; then  # hybrid targets (issue #9): random Qwen3-Next and the live-token one
  python3 "$B/mk_hybrid.py" /tmp/models /tmp/models >> "$OUT/models.log" 2>&1 && python3 bench/e2e/mk_hybrid_live.py /tmp/models /tmp/models >> "$OUT/models.log" 2>&1 || { tail "$OUT/models.log"; exit 3; }
fi
tail -1 "$OUT/models.log"
echo "setup $(( $(date +%s) - T0 ))s"
mkdir -p /tmp/res-$TAG
[ -n "$CONFIGS" ] && python3 bench/e2e/e2e_driver.py orchestrate /tmp/res-$TAG "$CONFIGS" 2>&1 | tee "$OUT/orchestrate-$TAG.log"
[ -n "$SEQ" ] && E2E_WORKERS=1 E2E_DEADLINE=${E2E_SEQ_DEADLINE:-330} python3 bench/e2e/e2e_driver.py orchestrate /tmp/res-$TAG "$SEQ" 2>&1 | tee -a "$OUT/orchestrate-$TAG.log"
python3 bench/e2e/e2e_driver.py report /tmp/res-$TAG "$OUT/$TAG" > /dev/null
cat "$OUT/$TAG.md"
tar czf "$OUT/$TAG-raw.tgz" -C /tmp/res-$TAG .
for f in /tmp/res-$TAG/logs/*.log; do echo "== $f"; grep -E "Error|Traceback|DDTree|Exception|cuda graph" "$f" | grep -v -E "UserWarning|Ignore import error" | head -6; done 2>/dev/null | head -150
echo "total $(( $(date +%s) - T0 ))s"
