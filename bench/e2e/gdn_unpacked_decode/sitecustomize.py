"""Benchmark-only switch (bench/e2e, never shipped): make SGLang 0.5.11's GDN *decode* use the same kernel math as
its target *verify*.

Why: SGLang 0.5.11 decodes GatedDeltaNet layers with a packed kernel
(`fused_recurrent_gated_delta_rule_packed_decode`) that rounds beta = sigmoid(b) to bf16, while target verify (every
speculative method: EAGLE/MTP, the DFlash chain, DDTree) runs `fused_sigmoid_gating_delta_rule_update`, which keeps
beta in fp32. So on hybrid targets speculative decoding and plain decoding differ by the base's own numerics, before
DDTree is involved. With `TritonGDNKernel.supports_packed_decode = False` plain decoding goes through
`TritonGDNKernel.decode`, i.e. `fused_sigmoid_gating_delta_rule_update` without the tree: the verify kernel's math.

How: bench/e2e/driver.py puts this directory first on PYTHONPATH for the `arv` algorithm (AR, verify math), so every
process of that Engine imports this file at start-up; it flips the class attribute right after SGLang's module
is executed (an import hook; nothing else is touched).
"""
import sys

try:
    from bench.e2e.import_hook import after_import
except ImportError as e:  # a hook that silently did nothing would measure something else: stop the process
    raise SystemExit(f"bench/e2e/gdn_unpacked_decode: {e}: the repository root must be on PYTHONPATH") from e

_TARGET = "sglang.srt.layers.attention.linear.kernels.gdn_triton"


def _flip(module) -> None:
    module.TritonGDNKernel.supports_packed_decode = False
    print("[bench/e2e] GDN packed decode off: plain decode uses the verify kernel's math", file=sys.stderr)


after_import(_TARGET, _flip)
