#!/bin/bash
# Make the offline bundle for a newer spec-v2 SGLang (0.5.18 and later) from the 0.5.17 one, for the H200 here.
# Usage (repo root): bash bench/e2e/mk_bundle.sh 0.5.N [SHARED_0517_BUNDLE]
#   -> .e2eN/ (ignored): the 0.5.17 bundle with sglang 0.5.N's cp312 wheel (trimmed like 0.5.17's) in place of
#      0.5.17's, and the DDTree overlay built for 0.5.N into .e2eN/overlay/ by `ddtree-deploy patchset build`.
# What stays from 0.5.17's bundle, and why (bench/results/sglang-0.5.18-h200-notes.md):
#   sglang-kernel 0.4.5: the kernel wheels 0.5.18-0.5.23 pin (0.4.6.post1 ... 0.4.10) are built against torch 2.13 /
#   2.14 and do not load on the H200's torch 2.11 (python3 -m bench.e2e.kernel_abi names the missing symbols);
#   the run sets SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1, SGLang's own switch for its engine-start version check.
#   transformers 5.12.1 and the small wheels: 0.5.18-0.5.21 pin the same; 0.5.22+ pin others (not made here).
# The wheel comes from the package registry (pip download, cp312 as the H200's Python 3.12); nothing else is fetched.
set -eu
BASE=$1; SRC=${2:-../shared/gpu-e2e-0.5.17}
N=${BASE##*.}; DEST=.e2e$N
PY=${PY:-.venv/bin/python}
case "$BASE" in 0.5.1[8-9]|0.5.2[0-1]) ;; *) echo "mk_bundle.sh: only 0.5.18-0.5.21 share 0.5.17's pins (got $BASE)" >&2; exit 2 ;; esac
[ -d "$SRC/wheels" ] || { echo "mk_bundle.sh: no 0.5.17 bundle at $SRC" >&2; exit 2; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_34_x86_64 \
  -d "$W" "sglang==$BASE"
WHEEL=$(ls "$W"/sglang-"$BASE"-cp312-*.whl)
rm -rf "$DEST"; cp -r "$SRC" "$DEST"; chmod -R u+w "$DEST"; rm -rf "$DEST/overlay" "$DEST"/wheels/sglang-0.5.17-*.whl
# the same members 0.5.17's bundle drops (its README: Rust servers and extensions, the diffusion runtime)
"$PY" "$SRC/build/trim_wheel.py" "$WHEEL" "$DEST/wheels/$(basename "$WHEEL")" \
  'sglang/srt/rust_extensions/_*.so' 'sglang/srt/server/_core.*.so' 'sglang/srt/grpc/_core.*.so' \
  'sglang/srt/multimodal/_core.*.so' 'sglang/multimodal_gen/*' > "$W/trim.log"
head -1 "$W/trim.log"
# 0.5.21's DFLASH worker imports flashinfer's renorm kernels on CUDA unconditionally and runs them at start-up
# (prewarm_sampling) and in its T > 0 verify. flashinfer cannot travel with the bundle (bench/results/
# sglang-0.5.21-h200-notes.md), so the shim gives those two functions the torch computations SGLang itself falls back
# to where flashinfer is absent (sglang.srt.layers.sampler.top_p_normalize_probs_torch and dflash_utils' top-k
# path). The sampling-from-probs kernels stay refused (the runs use --sampling-backend pytorch).
cat > "$DEST/shim/flashinfer/sampling.py" <<'PYEOF'
"""flashinfer.sampling stand-in for the offline H200 bundle (see bench/e2e/mk_bundle.sh)."""
import torch


def _unavailable(*args, **kwargs):
    raise NotImplementedError("flashinfer shim: use --sampling-backend pytorch")


min_p_sampling_from_probs = _unavailable
top_k_top_p_sampling_from_probs = _unavailable


def top_p_renorm_probs(probs, top_p):
    """Keep the smallest prefix of each row (by descending probability) whose mass reaches top_p; renormalise."""
    top_p = torch.as_tensor(top_p, device=probs.device, dtype=probs.dtype).reshape(-1, 1)
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill((sorted_p.cumsum(dim=-1) - sorted_p) > top_p, 0.0)
    sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, idx, sorted_p)


def top_k_renorm_probs(probs, top_k):
    """Keep each row's top_k largest probabilities (top_k <= 0 or >= vocab keeps all); renormalise."""
    vocab = probs.shape[-1]
    k = torch.as_tensor(top_k, device=probs.device, dtype=torch.int64).reshape(-1)
    k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k).expand(probs.shape[0])
    kmax = int(k.max().item())
    vals, idx = torch.topk(probs, k=kmax, dim=-1)
    vals = vals.masked_fill(torch.arange(kmax, device=probs.device)[None, :] >= k[:, None], 0.0)
    vals = vals / vals.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, idx, vals)
PYEOF
# 0.5.20+ also rehearse the T > 0 verify at start-up (DFlashWorkerV2.prewarm_sampling), which JIT-compiles SGLang's
# speculative sampling kernel (sglang/kernels/jit, nvcc on the GPU machine) against flashinfer's headers. The whole
# flashinfer wheel (18 MB) does not fit beside the bundle in one device call, so the shim carries the real headers that
# kernel includes (flashinfer/sampling.cuh and what it includes, taken from the flashinfer wheel the base pins) and
# empty folders for the other include paths SGLang's loader insists on.
FI=$(unzip -p "$DEST/wheels/$(basename "$WHEEL")" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: flashinfer[-_]python[^=]*==\([^ ;)]*\).*/\1/p' | head -1)
if [ -n "$FI" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$W" "flashinfer-python==$FI"
  "$PY" - "$W"/flashinfer_python-"$FI"-*.whl "$DEST/shim/flashinfer/data" <<'PYEOF'
import posixpath, re, sys, zipfile
from pathlib import Path
wheel, dest = zipfile.ZipFile(sys.argv[1]), Path(sys.argv[2])
root = "flashinfer/data/include/"
names = set(wheel.namelist())
seen, todo = set(), ["flashinfer/sampling.cuh"]
while todo:
    rel = todo.pop()
    if rel in seen or root + rel not in names:
        continue
    seen.add(rel)
    for inc in re.findall(r'#include\s*[<"]([^>"]+)[>"]', wheel.read(root + rel).decode()):
        for cand in (posixpath.normpath(posixpath.join(posixpath.dirname(rel), inc)), inc):
            if root + cand in names:
                todo.append(cand)
                break
for rel in sorted(seen):
    out = dest / "include" / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(wheel.read(root + rel))
for empty in ("csrc", "cutlass/include", "cutlass/tools/util/include", "spdlog/include"):
    (dest / empty).mkdir(parents=True, exist_ok=True)
    (dest / empty / "README").write_text("empty: the offline bundle's kernels include nothing from here\n")
print(f"flashinfer headers: {len(seen)} from {Path(sys.argv[1]).name}")
PYEOF
fi
# ddtree-deploy's own pure-Python dependencies the GPU image lacks, for bench/e2e/apply_on_gpu.sh
mkdir -p "$DEST/tool-wheels"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$DEST/tool-wheels" \
  platformdirs tenacity "ruamel.yaml"
"$PY" -m ddtree_deploy patchset build ddtree --base "sglang==$BASE" --out "$DEST/overlay" | tail -1
du -sh "$DEST"
