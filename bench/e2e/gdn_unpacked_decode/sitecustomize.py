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
import importlib.abc
import importlib.util
import sys

_TARGET = "sglang.srt.layers.attention.linear.kernels.gdn_triton"


class _Flip(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        module.TritonGDNKernel.supports_packed_decode = False
        print("[bench/e2e] GDN packed decode off: plain decode uses the verify kernel's math", file=sys.stderr)


sys.meta_path.insert(0, _Flip())
