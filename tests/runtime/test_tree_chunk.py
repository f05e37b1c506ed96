"""The GatedDeltaNet tree verify in chunk form (tree ancestors, records, commit from records) against the float64
per-path oracle of test_tree_recurrent: the oracle runs the plain chain recurrence along every node's root->node
path, so it knows nothing of chunks, masks or records. The plain-torch reference and the Triton kernel
(interpreted on CPU, compiled on the GPU when present) must both reproduce it, on fresh random inputs and on the
edge cases (one node, chains across several 16-node blocks, wide trees, padded slots and requests).
"""
from __future__ import annotations

import importlib

import pytest
import torch
from rt_env import needs_triton
from test_tree_recurrent import (
    TREES,
    _to,
    as_parent,
    chain,
    conv_inputs,
    conv_oracle,
    deep_with_siblings,
    draft_tree_parents,
    gdn_inputs,
    gdn_oracle,
    path_of,
    random_tree,
    wide,
)

TC = importlib.import_module("ddtree_runtime.tree_chunk")
TR = importlib.import_module("ddtree_runtime.tree_recurrent")
IMPLS = ["torch", pytest.param("triton", marks=needs_triton)]

# trees past one 16-node block: the kernel's cross-block terms and its in-block forward substitution both run
BIG_TREES = {
    "chain40": lambda g: [chain(40)],
    "mixed35": lambda g: [random_tree(g, 35), wide(35), deep_with_siblings(35), random_tree(g, 35, unused=5)],
}


def ancestors_oracle(parent: torch.Tensor) -> torch.Tensor:
    batch, n1 = parent.shape
    out = torch.zeros(batch, n1, n1, dtype=torch.int8)
    for b in range(batch):
        for i in range(n1):
            out[b, i, path_of(parent[b].tolist(), i)] = 1
    return out


def records_oracle(q, k, v, g, beta, parent, h0, slot, l2norm):
    """float64 records from the per-path recurrence: u_i = beta (v_i - exp(g_i) h_parent k_i), k_i normalised,
    G_i = the sum of g along the path."""
    batch, n1, heads, kdim = q.shape
    hv, vdim = v.shape[2], v.shape[3]
    _, states = gdn_oracle(q, k, v, g, beta, parent, h0, slot, 1.0, l2norm)
    rep = hv // heads
    kk = k.double().repeat_interleave(rep, dim=2)
    if l2norm:
        kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
    rec = torch.zeros(batch, n1, hv, vdim + kdim + 1, dtype=torch.float64)
    for b in range(batch):
        prow = parent[b].tolist()
        start = h0[int(slot[b])].double() if int(slot[b]) >= 0 else torch.zeros(hv, vdim, kdim, dtype=torch.float64)
        for i in range(n1):
            hp = states[b, prow[i]] if prow[i] >= 0 else start
            decayed = hp * torch.exp(g[b, i].double())[:, None, None]
            u = beta[b, i].double()[:, None] * (v[b, i].double() - (decayed * kk[b, i][:, None, :]).sum(-1))
            gsum = sum(g[b, j].double() for j in path_of(prow, i))
            rec[b, i] = torch.cat([u, kk[b, i], gsum[:, None]], dim=-1)
    return rec


@pytest.mark.parametrize("shape", list(TREES) + list(BIG_TREES))
def test_ancestors_match_the_paths(shape, gen, dev):
    parent = as_parent({**TREES, **BIG_TREES}[shape](gen))
    anc = TC.tree_ancestors(parent.to(dev))
    assert anc.dtype == torch.int8
    assert torch.equal(anc.cpu(), ancestors_oracle(parent))


def test_ancestors_of_real_draft_trees(rt, gen):
    parent = draft_tree_parents(rt, gen, batch=3, budget=30, depth=8)
    assert torch.equal(TC.tree_ancestors(parent), ancestors_oracle(parent))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", list(TREES) + list(BIG_TREES))
def test_chunk_matches_per_path_oracle(impl, shape, gen, dev):
    parent = as_parent({**TREES, **BIG_TREES}[shape](gen))
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, parent, kdim=12, vdim=20)
    scale = float(torch.rand((), generator=gen)) + 0.2
    o_ref, _ = gdn_oracle(q, k, v, g, beta, parent, h0, slot, scale, True)
    anc = TC.tree_ancestors(parent)
    o, rec = TC.tree_gated_delta_rule_chunk(*_to(dev, q, k, v, g, beta, anc, h0, slot), scale=scale,
                                            use_qk_l2norm=True, impl=impl)
    torch.testing.assert_close(o.cpu().double(), o_ref, rtol=1e-4, atol=1e-4)
    rec_ref = records_oracle(q, k, v, g, beta, parent, h0, slot, True)
    torch.testing.assert_close(rec.cpu().double(), rec_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_chunk_no_l2norm_gqa_padded_request_preallocated_records_float_mask(impl, gen, dev):
    parent = as_parent([random_tree(gen, 19), chain(19), deep_with_siblings(19)])
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, parent, heads=1, hv=3, kdim=16, vdim=8, l2norm=False)
    slot[1] = -1  # padded request: committed state reads as zeros
    o_ref, _ = gdn_oracle(q, k, v, g, beta, parent, h0, slot, 16 ** -0.5, False)
    records = torch.full((5, 19, 3, 8 + 16 + 1), 7.0)  # two rows more than the batch: left alone
    # the float32 mask TreeVerify keeps for a round is taken as it is
    anc = TC.tree_ancestors(parent).to(torch.float32)
    o, rec = TC.tree_gated_delta_rule_chunk(*_to(dev, q, k, v, g, beta, anc, h0, slot), records=records.to(dev),
                                            impl=impl)
    torch.testing.assert_close(o.cpu().double(), o_ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(rec[3:].cpu(), records[3:])


@needs_triton
def test_chunk_triton_equals_reference_on_draft_trees_bf16(rt, gen, dev):
    """Real DDTree trees (heap pop order), bf16 activations; both forms within bf16 accuracy of the oracle."""
    parent = draft_tree_parents(rt, gen, batch=2, budget=24, depth=7)
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, parent, dtype=torch.bfloat16)
    args = _to(dev, q, k, v, g, beta, TC.tree_ancestors(parent), h0, slot)
    o_t, r_t = TC.tree_gated_delta_rule_chunk(*args, use_qk_l2norm=True, impl="triton")
    o_r, r_r = TC.tree_gated_delta_rule_chunk(*args, use_qk_l2norm=True, impl="torch")
    assert o_t.dtype == torch.bfloat16 and r_t.dtype == torch.float32
    torch.testing.assert_close(r_t.cpu(), r_r.cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(o_t.float().cpu(), o_r.float().cpu(), rtol=2e-2, atol=2e-2)
    o_ref, _ = gdn_oracle(q, k, v, g, beta, parent, h0, slot, 12 ** -0.5, True)
    torch.testing.assert_close(o_t.cpu().double(), o_ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", ["mixed", "mixed35", "chain40"])
def test_commit_rebuilds_the_state_of_every_accepted_node(impl, shape, gen, dev):
    """For random accepted nodes (the root included), the state rebuilt from the records equals the oracle's
    state of that node, for every layer of a pool; a track slot committed first (source = the request's slot)
    and then the request's own slot in place; skipped requests leave their slots alone."""
    parent = as_parent({**TREES, **BIG_TREES}[shape](gen))
    batch, n1 = parent.shape
    layers = 2
    pools = torch.randn(layers, 9, 4, 20, 12, generator=gen)
    slot = torch.randperm(9, generator=gen)[:batch]
    track = torch.full((batch,), -1, dtype=torch.long)
    free = [s for s in range(9) if s not in slot.tolist()]
    track[0] = free[0]
    per_layer = [gdn_inputs(gen, parent, kdim=12, vdim=20) for _ in range(layers)]
    records, want = [], []
    for li, (q, k, v, g, beta, _, _) in enumerate(per_layer):
        _, rec = TC.tree_gated_delta_rule_chunk(*_to(dev, q, k, v, g, beta, TC.tree_ancestors(parent), pools[li],
                                                     slot), use_qk_l2norm=True, impl=impl)
        records.append(rec)
        want.append(gdn_oracle(q, k, v, g, beta, parent, pools[li], slot, 1.0, True)[1])
    records = torch.stack(records)
    last = torch.tensor([int(torch.randint(0, n1, (1,), generator=gen)) for _ in range(batch)])
    if batch > 1:
        last[1] = 0  # only the root accepted
    paths = [path_of(parent[b].tolist(), int(last[b])) for b in range(batch)]
    width = max(len(p) for p in paths) + 1
    path = torch.tensor([p + [-1] * (width - len(p)) for p in paths])
    steps = torch.tensor([len(p) - 1 for p in paths])
    tsteps = torch.full((batch,), -1, dtype=torch.long)
    tsteps[0] = max(int(steps[0]) - 1, 0)
    if batch > 2:
        steps[2] = -1  # nothing to commit for this request
    before = pools.clone()
    out = pools.clone().to(dev)
    TC.commit_tree_records_layers(out, records, *_to(dev, path, tsteps, slot, track), impl=impl)
    TC.commit_tree_records_layers(out, records, *_to(dev, path, steps, slot, slot), impl=impl)
    out = out.cpu().double()
    for li in range(layers):
        for b in range(batch):
            if int(steps[b]) >= 0:
                torch.testing.assert_close(out[li, int(slot[b])], want[li][b, int(last[b])], rtol=1e-4, atol=1e-4)
            else:
                assert torch.equal(out[li, int(slot[b])], before[li, int(slot[b])].double())
        tnode = paths[0][int(tsteps[0])]
        torch.testing.assert_close(out[li, int(track[0])], want[li][0, tnode], rtol=1e-4, atol=1e-4)
    untouched = [s for s in range(9) if s not in slot.tolist() and s != int(track[0])]
    assert torch.equal(out[:, untouched], before[:, untouched].double())


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_commit_copies_the_accepted_window(impl, gen, dev):
    parent = as_parent([random_tree(gen, 10), chain(10), wide(10)])
    x, cs, weight, bias, slot = conv_inputs(gen, parent, kc=4, slots=6)
    _, win = conv_oracle(x, parent, cs, slot, weight, bias, True)
    layers = 2
    pools = torch.randn(layers, 6, cs.shape[1], 3, generator=gen)
    node_conv = torch.stack([win.float(), win.float() + 1])
    acc = torch.tensor([7, 3, -1])
    out = TC.commit_tree_conv_layers(pools.clone().to(dev), *_to(dev, node_conv, acc, slot), impl=impl).cpu()
    for li in range(layers):
        for b in range(2):
            assert torch.equal(out[li, int(slot[b])], node_conv[li, b, int(acc[b])])
        assert torch.equal(out[li, int(slot[2])], pools[li, int(slot[2])])


def test_chunk_refuses_bad_shapes_naming_them():
    parent = as_parent([chain(4)])
    q, k, v, g, beta, h0, slot = gdn_inputs(torch.Generator().manual_seed(0), parent)
    with pytest.raises(ValueError, match="anc must be"):
        TC.tree_gated_delta_rule_chunk(q, k, v, g, beta, torch.ones(1, 4, 3, dtype=torch.int8), h0, slot,
                                       impl="torch")
    with pytest.raises(ValueError, match="records must be"):
        TC.tree_gated_delta_rule_chunk(q, k, v, g, beta, TC.tree_ancestors(parent), h0, slot,
                                       records=torch.zeros(1, 4, 4, 10), impl="torch")
    with pytest.raises(ValueError, match="records must be float32"):
        TC.commit_tree_records_layers(h0[None], torch.zeros(1, 1, 4, 4, 7), torch.zeros(1, 2, dtype=torch.long),
                                      torch.zeros(1, dtype=torch.long), slot, slot, impl="torch")


def test_record_is_much_smaller_than_a_state():
    # Qwen3.6-27B's GDN shape: 48 value heads, K = V = 128
    assert TC.per_node_record_bytes(48, 128, 128) == 48 * 257 * 4
    assert TR.per_node_state_bytes(48, 128, 128, 0, 1) / TC.per_node_record_bytes(48, 128, 128) > 60
