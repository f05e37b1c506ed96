#!/bin/bash
# Make the offline SGLang 0.5.17 bundle with the REAL FlashInfer, for `--attention-backend flashinfer` on the H200.
# Usage (repo root): bash bench/e2e/mk_bundle_flashinfer.sh [SHARED_0517_BUNDLE]   (default ../shared/gpu-e2e-0.5.17)
#   -> .e2e17fi/ (ignored; E2E_FI_DEST names another folder): the 0.5.17 bundle's wheels, with
#      - flashinfer_python at the version sglang 0.5.17 pins (read from its METADATA), from the package registry, its
#        data/ cut to the #include closure of the JIT sources on the FlashInfer backend's path and the CCCL headers,
#        without the modules that cannot import without the CuTe DSL or cuTile (bench/e2e/fi_bundle.py);
#      - transformers 5.12.1 (the pin) without the per-model code no import on this path reaches (fi_bundle.py);
#      - apache_tvm_ffi without the libbacktrace sources it was built from (fi_bundle.py);
#      - soundfile (with cffi, pycparser) replaced by a shim: imported at module level, used only for audio;
#      - the 0.5.17 bundle's xgrammar and IPython shims; NOT its flashinfer shim (the real package is installed);
#      - the DDTree overlay for 0.5.17 (`ddtree-deploy patchset build`) in .e2e17fi/overlay/;
#      - README.md: bench/e2e/bundle-flashinfer.md (what is real, what is shimmed, how to run it).
# Then gpu_run.sh runs it with E2E_BUNDLE=.e2e17fi (bench/e2e/README.md, "FlashInfer on the H200").
# Prints each part's size, and the bundle with the tracked working tree against the 64 MiB a device call carries.
set -eu
SRC=${1:-../shared/gpu-e2e-0.5.17}; DEST=${E2E_FI_DEST:-.e2e17fi}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d "$SRC/wheels" ] && [ -f "$SRC/build/trim_wheel.py" ] || { echo "mk_bundle_flashinfer.sh: no 0.5.17 bundle at $SRC" >&2; exit 2; }
SG=$(ls "$SRC"/wheels/sglang-0.5.17-*.whl)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
FI=$(unzip -p "$SG" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: flashinfer[-_]python[^=]*==\([^ ;)]*\).*/\1/p' | head -1)
[ -n "$FI" ] || { echo "mk_bundle_flashinfer.sh: sglang 0.5.17's METADATA pins no flashinfer_python" >&2; exit 2; }
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$W" "flashinfer-python==$FI" 2>&1 \
  | grep -v "^WARNING: Location" || true
FIW=$(ls "$W"/flashinfer_python-"$FI"-*.whl)
rm -rf "$DEST"; mkdir -p "$DEST/wheels" "$DEST/shim" "$DEST/build"
cp "$SRC/build/trim_wheel.py" "$DEST/build/"
for f in "$SRC"/wheels/*.whl; do
  case $(basename "$f") in
    transformers-*|apache_tvm_ffi-*) ;;          # trimmed below
    soundfile-*|cffi-*|pycparser-*) ;;            # shimmed below (cffi and pycparser only serve soundfile)
    *) cp "$f" "$DEST/wheels/" ;;
  esac
done
T=$SRC/build/trim_wheel.py
"$PY" -m bench.e2e.fi_bundle trim flashinfer "$FIW" "$DEST/wheels/$(basename "$FIW")" "$T" > "$W/fi.log"
"$PY" -m bench.e2e.fi_bundle trim transformers "$(ls "$SRC"/wheels/transformers-*.whl)" \
  "$DEST/wheels/$(basename "$SRC"/wheels/transformers-*.whl)" "$T" > "$W/tf.log"
"$PY" -m bench.e2e.fi_bundle trim tvm-ffi "$(ls "$SRC"/wheels/apache_tvm_ffi-*.whl)" \
  "$DEST/wheels/$(basename "$SRC"/wheels/apache_tvm_ffi-*.whl)" "$T" > "$W/tvm.log"
for k in fi tf tvm; do echo "$k: $(head -1 "$W/$k.log")"; done
cp -r "$SRC/shim/xgrammar" "$SRC/shim/IPython" "$DEST/shim/"
chmod -R u+w "$DEST"
cat > "$DEST/shim/soundfile.py" <<'PYEOF'
"""soundfile stand-in for the offline FlashInfer bundle (bench/e2e/mk_bundle_flashinfer.sh): SGLang 0.5.17 imports
it at module level (entrypoints/openai/realtime/session.py, streaming_asr.py, ...) and calls it only for audio."""


class LibsndfileError(RuntimeError):
    """What SGLang catches around its calls."""


def _unavailable(*args, **kwargs):
    raise NotImplementedError("soundfile shim: no audio in the offline FlashInfer bundle")


read = write = info = _unavailable
PYEOF
cp bench/e2e/bundle-flashinfer.md "$DEST/README.md"
"$PY" -m ddtree_deploy patchset build ddtree --base sglang==0.5.17 --out "$DEST/overlay" | tail -1
MIB() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
echo "sizes (du -sb):"
for f in "$DEST"/wheels/*.whl; do printf '  %-12s %s\n' "$(MIB "$(stat -c %s "$f")")" "$(basename "$f")"; done | sort -rn | head -8
echo "  wheels $(MIB "$(du -sb "$DEST/wheels" | cut -f1)") ($(ls "$DEST"/wheels | wc -l) files), shim $(MIB "$(du -sb "$DEST/shim" | cut -f1)"), overlay $(MIB "$(du -sb "$DEST/overlay" | cut -f1)")"
B=$(du -sb "$DEST" | cut -f1)
TR=$(git ls-files -z -c -o --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)  # what a call carries besides
echo "  $DEST $(MIB "$B") + working tree $(MIB "$TR") = $(MIB $((B + TR))) of the 64 MiB a device call carries ($(MIB $((67108864 - B - TR))) left)"
