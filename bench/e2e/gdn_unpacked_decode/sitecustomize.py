"""Benchmark-only switch (bench/e2e, never shipped): make SGLang's GDN *decode* use the same kernel math as a
speculative *verify*, so that plain decoding is a bit-exact reference for it.

``E2E_GDN_DECODE=verify`` (the default; the `arv` configurations): the base's chain verify math. SGLang decodes
GatedDeltaNet layers with a packed kernel (`fused_recurrent_gated_delta_rule_packed_decode`) that rounds
beta = sigmoid(b) to bf16, while target verify (EAGLE/MTP, the DFlash chain) runs
`fused_sigmoid_gating_delta_rule_update`, which keeps beta in fp32. So on hybrid targets speculative decoding and
plain decoding differ by the base's own numerics. With `TritonGDNKernel.supports_packed_decode = False` plain
decoding goes through `TritonGDNKernel.decode`, i.e. `fused_sigmoid_gating_delta_rule_update` without the tree.

``E2E_GDN_DECODE=tree`` (the `ard` configurations, SGLang 0.5.17 with the DDTree overlay): DDTree's verify math.
DDTree verifies GDN layers through the DDTree runtime's own tree kernels (``ddtree_v2.hybrid.tree_layer``), whose
rounding differs from the chain kernel's, so DDTree and the stock chain flip bf16 near-ties differently. Here every
decode step runs ``tree_layer`` as a 1-node tree from the request's committed state and commits that node, as
DDTree's commit does; the tree kernels' result depends only on the path, not on where rounds end
(tests/runtime/test_tree_recurrent.py::test_a_path_split_into_rounds_anywhere_gives_the_same_bits), so DDTree at
any budget should match this plain decoding token for token.

How: bench/e2e/driver.py puts this directory first on PYTHONPATH for the `arv` / `ard` algorithms (AR with a
verify's math), so every process of that Engine imports this file at start-up; an import hook changes the one class
right after SGLang's module is executed (nothing else is touched).
"""
import os
import sys

try:
    from bench.e2e.import_hook import after_import
except ImportError as e:  # a hook that silently did nothing would measure something else: stop the process
    raise SystemExit(f"bench/e2e/gdn_unpacked_decode: {e}: the repository root must be on PYTHONPATH") from e

_MODE = os.environ.get("E2E_GDN_DECODE", "verify")


def _unpacked(module):
    module.TritonGDNKernel.supports_packed_decode = False
    print("[bench/e2e] GDN packed decode off: plain decode uses the verify kernel's math", file=sys.stderr)


def _tree(module):
    import torch
    from sglang.srt.speculative.ddtree_v2 import hybrid
    from sglang.srt.speculative.ddtree_v2.draft_topk import runtime

    cls = module.GDNAttnBackend
    stock = cls.forward_decode

    def forward_decode(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        if getattr(cache, "replayssm_d", None) is not None:
            return stock(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
        bs = mixed_qkv.shape[0]
        conv, ssm = cache.conv[0], cache.temporal
        slots = self.forward_metadata.mamba_cache_indices[:bs]
        parent = torch.full((bs, 1), -1, dtype=torch.int32, device=mixed_qkv.device)
        node_conv = torch.empty((bs, 1, conv.shape[1], layer.conv_weights.shape[-1] - 1), dtype=conv.dtype,
                                device=conv.device)
        node_ssm = torch.empty((bs, 1, *ssm.shape[1:]), dtype=ssm.dtype, device=ssm.device)
        o = hybrid.tree_layer(layer, mixed_qkv.reshape(bs, 1, -1), a, b, parent, conv, ssm, slots, node_conv=node_conv,
                              node_ssm=node_ssm, impl=hybrid._impl())
        runtime().commit_tree_states(ssm, conv, node_ssm, node_conv, torch.zeros_like(slots), slots,
                                     impl=hybrid._impl())
        self._track_mamba_state_decode(forward_batch, conv, ssm, self.forward_metadata.mamba_cache_indices,
                                       layer.layer_id)
        return o.view(1, bs, layer.num_v_heads, layer.head_v_dim)

    cls.forward_decode = forward_decode
    print("[bench/e2e] GDN decode through DDTree's tree kernels: plain decode uses DDTree's verify math",
          file=sys.stderr)


_HOOKS = {"verify": ("sglang.srt.layers.attention.linear.kernels.gdn_triton", _unpacked),
          "tree": ("sglang.srt.layers.attention.linear.gdn_backend", _tree)}
if _MODE not in _HOOKS:
    raise SystemExit(f"E2E_GDN_DECODE must be one of {sorted(_HOOKS)}, got {_MODE!r}")
_TARGET, _ON_EXEC = _HOOKS[_MODE]
after_import(_TARGET, _ON_EXEC)
