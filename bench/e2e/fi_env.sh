#!/bin/bash
# Source it (`. bench/e2e/fi_env.sh`) where the REAL FlashInfer runs offline: gpu_run.sh for a bundle with a
# flashinfer_python wheel (.e2e17fi), fi_cpu_check.sh for its CPU compile check. Sets what FlashInfer's JIT needs:
#   FLASHINFER_WORKSPACE_BASE (default /tmp/flashinfer; the JIT's cache is $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer),
#   FLASHINFER_NO_DOWNLOAD=1 (a kernel that needs a downloaded cubin fails at once instead of trying the network),
#   FLASHINFER_CUBIN_DIR, CUDA_HOME (when unset), and FLASHINFER_EXTRA_LDFLAGS / FLASHINFER_EXTRA_CUDAFLAGS where the
#   toolkit lacks what the JIT links or includes. Prints one line saying what it chose (appended to $OUT/setup.log
#   when OUT is set).
# FlashInfer's JIT (flashinfer/jit/cpp_ext.py): nvcc from $CUDA_HOME (else `which nvcc`'s prefix), links
# -L$CUDA_HOME/lib64{,/stubs} -lcudart -lcuda; where the toolkit lacks an unversioned libcudart.so / libcuda.so, the
# runtime wheel's and the driver's are linked through FLASHINFER_EXTRA_LDFLAGS
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer} FLASHINFER_NO_DOWNLOAD=1
export FLASHINFER_CUBIN_DIR=$FLASHINFER_WORKSPACE_BASE/cubins
if [ -z "${CUDA_HOME:-}" ]; then
  for d in "$(dirname "$(dirname "$(command -v nvcc)")")" /usr/local/cuda /usr/local/cuda-*; do
    [ -x "$d/bin/nvcc" ] && [ -f "$d/include/cuda_runtime.h" ] && { export CUDA_HOME=$d; break; }
  done
fi
FL=$FLASHINFER_WORKSPACE_BASE/ld; mkdir -p "$FL" "$FLASHINFER_CUBIN_DIR"
if ! ls "${CUDA_HOME:-/none}"/lib64/libcudart.so "${CUDA_HOME:-/none}"/lib64/stubs/libcudart.so > /dev/null 2>&1; then
  RT=$(python3 -c 'import glob, nvidia.cuda_runtime as m; print(sorted(glob.glob(m.__path__[0] + "/lib/libcudart.so.*"))[0])' 2>/dev/null || true)
  if [ -n "$RT" ]; then ln -sf "$RT" "$FL/libcudart.so"; fi
fi
if ! ls "${CUDA_HOME:-/none}"/lib64/libcuda.so "${CUDA_HOME:-/none}"/lib64/stubs/libcuda.so > /dev/null 2>&1; then
  CU=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
  LDP=${LD_LIBRARY_PATH:-}; for d in ${LDP//:/ } /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -z "$CU" ] && [ -e "$d/libcuda.so.1" ] && CU=$d/libcuda.so.1
  done
  if [ -n "$CU" ]; then ln -sf "$CU" "$FL/libcuda.so"; fi
fi
export FLASHINFER_EXTRA_LDFLAGS="-L$FL${FLASHINFER_EXTRA_LDFLAGS:+ $FLASHINFER_EXTRA_LDFLAGS}"
# the fa3 (Hopper) prefill includes CUTLASS's tensor_fill.h, which includes curand_kernel.h: where the toolkit has
# no cuRAND headers, the nvidia-curand wheel's (torch's dependency) are put on the include path, alone
if [ ! -f "${CUDA_HOME:-/none}/include/curand_kernel.h" ]; then
  FI_INC=$FLASHINFER_WORKSPACE_BASE/include; mkdir -p "$FI_INC"
  python3 -c 'import glob, nvidia; print("\n".join(sorted({f for p in nvidia.__path__ for f in glob.glob(p + "/*/include/curand*.h")})))' 2>/dev/null \
    | while read -r f; do ln -sf "$f" "$FI_INC/"; done
  export FLASHINFER_EXTRA_CUDAFLAGS="-isystem $FI_INC${FLASHINFER_EXTRA_CUDAFLAGS:+ $FLASHINFER_EXTRA_CUDAFLAGS}"
fi
echo "flashinfer JIT: CUDA_HOME=${CUDA_HOME:-unset} ($("${CUDA_HOME:-/none}"/bin/nvcc --version 2>&1 | grep -o 'release [^,]*, V[0-9.]*' || echo 'no nvcc')), cache $FLASHINFER_WORKSPACE_BASE, linked through $FL: $(ls -l "$FL" | awk 'NR>1{print $9, $11}' | tr '\n' ' ')${FI_INC:+; cuRAND headers from $(readlink "$FI_INC/curand_kernel.h")}" | tee -a "${OUT:-/dev/null}/setup.log" 2>/dev/null || true
