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
"$PY" -m ddtree_deploy patchset build ddtree --base "sglang==$BASE" --out "$DEST/overlay" | tail -1
du -sh "$DEST"
