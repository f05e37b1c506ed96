"""Recurrent-state branching (tree conv1d, tree gated delta rule, commit) against a float64 per-path oracle.

The oracle knows nothing about trees: for every node it runs the ordinary chain recurrence in float64 from the
request's committed state along the node's root->node path. Both the plain-torch reference and the Triton kernels
(interpreted on CPU, on the GPU when present) must reproduce it on random inputs, and must agree with each other.
"""
from __future__ import annotations

import importlib

import pytest
import torch
from rt_env import needs_triton
from rt_helpers import random_logits

TR = importlib.import_module("ddtree_runtime.tree_recurrent")
IMPLS = ["torch", pytest.param("triton", marks=needs_triton)]


# ------------------------------------------------------------------------------------------------ trees


def path_of(parent_row: list[int], i: int) -> list[int]:
    """Root -> node path of node i (stops at parent -1)."""
    path = [i]
    while parent_row[path[-1]] >= 0:
        path.append(parent_row[path[-1]])
    return path[::-1]


def chain(n1):
    return [-1] + list(range(n1 - 1))


def wide(n1):
    return [-1] + [0] * (n1 - 1)


def random_tree(gen, n1, unused=0):
    """Random recursive tree in parent-before-child order; the last ``unused`` slots are padding (parent -1)."""
    par = [-1]
    for i in range(1, n1 - unused):
        par.append(int(torch.randint(0, i, (1,), generator=gen)))
    return par + [-1] * unused


def deep_with_siblings(n1):
    """A spine as deep as possible, each spine node also has one leaf sibling (heap pop order: spine first)."""
    par, spine = [-1], 0
    while len(par) < n1:
        par.append(spine)          # next spine node
        new_spine = len(par) - 1
        if len(par) < n1:
            par.append(spine)      # its sibling leaf
        spine = new_spine
    return par


def draft_tree_parents(rt, gen, batch, budget, depth=6, vocab=11, kind="normal"):
    """Parents of real DDTree trees (the runtime's own builder: heap pop order, not BFS)."""
    logits = random_logits(gen, batch, depth, vocab, kind)
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return rt.build_tree(lp, tok, roots, budget, impl="torch").parent


def as_parent(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


TREES = {
    "root_only": lambda g: [[-1]],
    "budget1": lambda g: [[-1, 0], [-1, 0]],
    "chain": lambda g: [chain(9), chain(9)],
    "wide": lambda g: [wide(12)],
    "deepest": lambda g: [deep_with_siblings(13), chain(13)],
    "mixed": lambda g: [random_tree(g, 10), wide(10), chain(10), random_tree(g, 10, unused=3)],
}


# ------------------------------------------------------------------------------------------- the oracle


def gdn_oracle(q, k, v, g, beta, parent, h0, slot, scale, l2norm):
    """float64 chain recurrence along every node's path; returns (o [B,N1,HV,V], states [B,N1,HV,V,K])."""
    batch, n1, heads, kdim = q.shape
    hv, vdim = v.shape[2], v.shape[3]
    rep = hv // heads
    q, k, v, g, beta = (t.double().cpu() for t in (q, k, v, g, beta))
    o = torch.zeros(batch, n1, hv, vdim, dtype=torch.float64)
    st = torch.zeros(batch, n1, hv, vdim, kdim, dtype=torch.float64)
    for b in range(batch):
        prow = parent[b].tolist()
        start = h0[int(slot[b])].double().cpu() if int(slot[b]) >= 0 else torch.zeros(hv, vdim, kdim,
                                                                                       dtype=torch.float64)
        for i in range(n1):
            h = start.clone()
            for j in path_of(prow, i):  # the plain chain recurrence, token by token
                for c in range(hv):
                    qq, kk = q[b, j, c // rep], k[b, j, c // rep]
                    if l2norm:
                        qq = qq / torch.sqrt((qq * qq).sum() + 1e-6)
                        kk = kk / torch.sqrt((kk * kk).sum() + 1e-6)
                    h[c] = h[c] * torch.exp(g[b, j, c])
                    vn = beta[b, j, c] * (v[b, j, c] - h[c] @ kk)
                    h[c] = h[c] + torch.outer(vn, kk)
                    if j == i:
                        o[b, i, c] = h[c] @ (qq * scale)
            st[b, i] = h
    return o, st


def conv_oracle(x, parent, conv_state, slot, weight, bias, silu):
    """float64: sequence = committed window (first K_conv-1 columns) then x along the path; conv at the end."""
    batch, n1, dim = x.shape
    kc = weight.shape[1]
    w = kc - 1
    x, weight = x.double().cpu(), weight.double().cpu()
    y = torch.zeros(batch, n1, dim, dtype=torch.float64)
    win = torch.zeros(batch, n1, dim, w, dtype=torch.float64)
    for b in range(batch):
        prow = parent[b].tolist()
        s = int(slot[b])
        init = conv_state[s, :, :w].double().cpu() if s >= 0 else torch.zeros(dim, w, dtype=torch.float64)
        for i in range(n1):
            seq = torch.cat([init, x[b, path_of(prow, i)].T], dim=1)  # [D, w + depth + 1], oldest first
            last = seq[:, -kc:]
            acc = (last * weight).sum(1)
            if bias is not None:
                acc = acc + bias.double().cpu()
            if silu:
                acc = acc * torch.sigmoid(acc)
            y[b, i] = acc
            win[b, i] = seq[:, -w:]
    return y, win


# ---------------------------------------------------------------------------------------------- inputs


def gdn_inputs(gen, parent, heads=2, hv=4, kdim=12, vdim=20, slots=6, l2norm=True, dtype=torch.float32):
    batch, n1 = parent.shape
    q = torch.randn(batch, n1, heads, kdim, generator=gen)
    k = torch.randn(batch, n1, heads, kdim, generator=gen)
    if not l2norm:  # keep |k| ~ 1 so the delta rule stays stable without the in-kernel normalisation
        k = k / kdim ** 0.5
    v = torch.randn(batch, n1, hv, vdim, generator=gen)
    g = -torch.rand(batch, n1, hv, generator=gen) * 0.5  # log decay <= 0
    beta = torch.rand(batch, n1, hv, generator=gen)
    h0 = torch.randn(slots, hv, vdim, kdim, generator=gen)
    slot = torch.randperm(slots, generator=gen)[:batch]
    return [t.to(dtype) for t in (q, k, v, g, beta)] + [h0, slot]


def conv_inputs(gen, parent, dim=24, kc=4, slots=5, sglang_layout=False):
    batch, n1 = parent.shape
    x = torch.randn(batch, n1, dim, generator=gen)
    if sglang_layout:  # SGLang's pool: [slots, D, state_len] with D contiguous
        cs = torch.randn(slots, kc - 1, dim, generator=gen).transpose(1, 2)
    else:
        cs = torch.randn(slots, dim, kc - 1, generator=gen)
    weight = torch.randn(dim, kc, generator=gen)
    bias = torch.randn(dim, generator=gen)
    slot = torch.randperm(slots, generator=gen)[:batch]
    return x, cs, weight, bias, slot


def _to(dev, *ts):
    return [t.to(dev) if isinstance(t, torch.Tensor) else t for t in ts]


# ----------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", list(TREES))
def test_gdn_matches_per_path_oracle(impl, shape, gen, dev):
    parent = as_parent(TREES[shape](gen))
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, parent)
    scale = float(torch.rand((), generator=gen)) + 0.2
    o_ref, st_ref = gdn_oracle(q, k, v, g, beta, parent, h0, slot, scale, True)
    o, st = TR.tree_gated_delta_rule(*_to(dev, q, k, v, g, beta, parent, h0, slot), scale=scale,
                                     use_qk_l2norm=True, impl=impl)
    torch.testing.assert_close(st.cpu().double(), st_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(o.cpu().double(), o_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_gdn_no_l2norm_gqa_and_padded_request(impl, gen, dev):
    parent = as_parent([random_tree(gen, 9), chain(9), deep_with_siblings(9)])
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, parent, heads=1, hv=3, kdim=16, vdim=8, l2norm=False)
    slot[1] = -1  # padded request: committed state reads as zeros
    o_ref, st_ref = gdn_oracle(q, k, v, g, beta, parent, h0, slot, 16 ** -0.5, False)
    o, st = TR.tree_gated_delta_rule(*_to(dev, q, k, v, g, beta, parent, h0, slot), impl=impl)
    torch.testing.assert_close(st.cpu().double(), st_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(o.cpu().double(), o_ref, rtol=1e-4, atol=1e-4)


@needs_triton
def test_gdn_triton_equals_reference_on_draft_trees(rt, gen, dev):
    """Real DDTree trees (heap pop order), bf16 activations and a bf16 per-node state buffer."""
    parent = draft_tree_parents(rt, gen, batch=3, budget=14)
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, parent, dtype=torch.bfloat16)
    args = _to(dev, q, k, v, g, beta, parent, h0, slot)
    o_t, st_t = TR.tree_gated_delta_rule(*args, use_qk_l2norm=True, state_dtype=torch.bfloat16, impl="triton")
    o_r, st_r = TR.tree_gated_delta_rule(*args, use_qk_l2norm=True, state_dtype=torch.bfloat16, impl="torch")
    assert st_t.dtype == torch.bfloat16 and o_t.dtype == torch.bfloat16
    torch.testing.assert_close(st_t.float(), st_r.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(o_t.float(), o_r.float(), rtol=2e-2, atol=2e-2)
    # and against the float64 oracle, within bf16 accuracy
    o_ref, st_ref = gdn_oracle(q, k, v, g, beta, parent, h0, slot, 12 ** -0.5, True)
    torch.testing.assert_close(st_t.cpu().double(), st_ref, rtol=5e-2, atol=5e-2)


@needs_triton
def test_gdn_bf16_state_is_a_function_of_the_path_only(gen, dev):
    """'State drift': with a narrow buffer the node on a chain (kept in registers) and the same path computed
    through a branch (reloaded from the buffer) must be bit-identical."""
    # request 0: chain 0-1-2-3; request 1: same inputs, but a sibling (node 2) interrupts the chain so node 3
    # (child of 1) is reached by a reload.
    p = as_parent([[-1, 0, 1, 2], [-1, 0, 0, 1]])
    q, k, v, g, beta, h0, _ = gdn_inputs(gen, p, slots=1)
    slot = torch.zeros(2, dtype=torch.long)
    for t in (q, k, v, g, beta):
        t[1] = t[0]
        t[1, 2] = torch.randn(t[1, 2].shape, generator=gen)  # the sibling differs
        t[1, 3] = t[0, 2]  # node 3 of request 1 plays node 2 of request 0
    o, st = TR.tree_gated_delta_rule(*_to(dev, q, k, v, g, beta, p, h0, slot), state_dtype=torch.bfloat16,
                                     impl="triton")
    assert torch.equal(st[1, 3], st[0, 2])
    assert torch.equal(o[1, 3], o[0, 2])
    assert not torch.equal(st[1, 2], st[0, 2])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("kc", [2, 4])
def test_conv_matches_per_path_oracle(impl, shape, kc, gen, dev):
    parent = as_parent(TREES[shape](gen))
    x, cs, weight, bias, slot = conv_inputs(gen, parent, kc=kc)
    y_ref, win_ref = conv_oracle(x, parent, cs, slot, weight, bias, True)
    y, win = TR.tree_causal_conv1d(*_to(dev, x, parent, cs, slot, weight, bias), activation="silu", impl=impl)
    torch.testing.assert_close(y.cpu().double(), y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(win.cpu().double(), win_ref)  # windows are copies of inputs: exact


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_sglang_layout_no_bias_wider_state_and_padding(impl, gen, dev):
    parent = as_parent([deep_with_siblings(11), random_tree(gen, 11, unused=2), wide(11)])
    x, cs, weight, _, slot = conv_inputs(gen, parent, dim=300, kc=3, sglang_layout=True)  # D > one block
    slot[2] = -1
    y_ref, win_ref = conv_oracle(x, parent, cs, slot, weight, None, False)
    y, win = TR.tree_causal_conv1d(*_to(dev, x, parent, cs, slot, weight), impl=impl)
    torch.testing.assert_close(y.cpu().double(), y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(win.cpu().double(), win_ref)


@needs_triton
def test_conv_triton_equals_reference_bf16_on_draft_trees(rt, gen, dev):
    parent = draft_tree_parents(rt, gen, batch=2, budget=20, kind="ties")
    x, cs, weight, bias, slot = (t.to(torch.bfloat16) if t.is_floating_point() else t
                                 for t in conv_inputs(gen, parent, dim=40))
    args = _to(dev, x, parent, cs, slot, weight, bias)
    y_t, w_t = TR.tree_causal_conv1d(*args, activation="silu", impl="triton")
    y_r, w_r = TR.tree_causal_conv1d(*args, activation="silu", impl="torch")
    assert torch.equal(w_t, w_r)
    torch.testing.assert_close(y_t.float(), y_r.float(), rtol=1e-2, atol=1e-2)


@needs_triton
@pytest.mark.parametrize("splits", [[4], [1, 1, 1, 1], [2, 1, 1], [1, 3]])
def test_a_path_split_into_rounds_anywhere_gives_the_same_bits(splits, gen, dev):
    """DDTree's outputs and committed states depend only on the path, not on where the rounds end (issue #15: b4
    and b16 accept differently yet emit byte-identical tokens; plain decoding through these kernels, one node per
    step, is then a bit-exact reference). A bf16 model's dtypes: bf16 activations and conv pool, fp32 SSM pool."""
    n = sum(splits)
    whole = as_parent([chain(n)] * 3)
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, whole, slots=5, dtype=torch.bfloat16)
    x, cs, weight, bias, _ = conv_inputs(gen, whole, slots=5)
    x, cs = x.to(torch.bfloat16), cs.to(torch.bfloat16)
    o_all, st_all = TR.tree_gated_delta_rule(*_to(dev, q, k, v, g, beta, whole, h0, slot), use_qk_l2norm=True,
                                             impl="triton")
    y_all, win_all = TR.tree_causal_conv1d(*_to(dev, x, whole, cs, slot, weight, bias), activation="silu",
                                           impl="triton")
    ssm_pool, conv_pool = h0.clone().to(dev), cs.clone().to(dev)
    start, outs, ys = 0, [], []
    for m in splits:  # a round of m nodes: verify a chain of m from the committed slot, commit its last node
        part = as_parent([chain(m)] * 3)
        sl = slice(start, start + m)
        o, st = TR.tree_gated_delta_rule(*_to(dev, q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], part,
                                              ssm_pool, slot), use_qk_l2norm=True, impl="triton")
        y, win = TR.tree_causal_conv1d(*_to(dev, x[:, sl].contiguous(), part, conv_pool, slot, weight, bias),
                                       activation="silu", impl="triton")
        last = torch.full((3,), m - 1, dtype=torch.long)
        TR.commit_tree_states(ssm_pool, conv_pool, st, win, *_to(dev, last, slot), impl="triton")
        outs.append(o)
        ys.append(y)
        start += m
    assert torch.equal(torch.cat(outs, 1), o_all)
    assert torch.equal(torch.cat(ys, 1), y_all)
    for b in range(3):
        assert torch.equal(ssm_pool[int(slot[b])], st_all[b, n - 1])
        assert torch.equal(conv_pool[int(slot[b])], win_all[b, n - 1])


@pytest.mark.parametrize("impl", IMPLS)
def test_commit_then_continue_equals_oracle(impl, gen, dev):
    """Verify a tree, accept a path, commit; the next round, started from the committed slot, must equal the
    oracle run along committed path + new path (state and conv window), and other slots must be untouched."""
    p1 = as_parent([random_tree(gen, 8), deep_with_siblings(8), wide(8)])
    batch, n1 = p1.shape
    q, k, v, g, beta, h0, slot = gdn_inputs(gen, p1, slots=7)
    x, cs, weight, bias, _ = conv_inputs(gen, p1, slots=7)
    slot[2] = -1  # padded request: commits nothing
    _, st = TR.tree_gated_delta_rule(*_to(dev, q, k, v, g, beta, p1, h0, slot), use_qk_l2norm=True, impl=impl)
    _, win = TR.tree_causal_conv1d(*_to(dev, x, p1, cs, slot, weight, bias), activation="silu", impl=impl)
    acc = torch.tensor([int(torch.randint(0, n1, (1,), generator=gen)), n1 - 1, 3])
    ssm_pool, conv_pool = h0.clone().to(dev), cs.clone().to(dev)
    TR.commit_tree_states(ssm_pool, conv_pool, st, win, *_to(dev, acc, slot), impl=impl)
    ssm_pool, conv_pool = ssm_pool.cpu(), conv_pool.cpu()
    _, st_ref = gdn_oracle(q, k, v, g, beta, p1, h0, slot, 12 ** -0.5, True)
    _, win_ref = conv_oracle(x, p1, cs, slot, weight, bias, True)
    untouched = torch.ones(h0.shape[0], dtype=torch.bool)
    for b in range(2):
        s, a = int(slot[b]), int(acc[b])
        untouched[s] = False
        torch.testing.assert_close(ssm_pool[s].double(), st_ref[b, a], rtol=1e-4, atol=1e-4)
        assert torch.equal(conv_pool[s].double(), win_ref[b, a])
    assert torch.equal(ssm_pool[untouched], h0[untouched])
    assert torch.equal(conv_pool[untouched], cs[untouched])

    # round 2 from the committed slots, checked against one long path in float64
    p2 = as_parent([random_tree(gen, 5), chain(5), wide(5)])
    q2, k2, v2, g2, beta2, _, _ = gdn_inputs(gen, p2)
    _, st2 = TR.tree_gated_delta_rule(*_to(dev, q2, k2, v2, g2, beta2, p2, ssm_pool, slot), use_qk_l2norm=True,
                                      impl=impl)
    for b in range(2):
        a = int(acc[b])
        path1 = path_of(p1[b].tolist(), a)
        m = len(path1)
        cat = [torch.cat([t[b:b + 1, path1], t2[b:b + 1]], dim=1) for t, t2 in
               ((q, q2), (k, k2), (v, v2), (g, g2), (beta, beta2))]
        pcat = as_parent([[-1] + list(range(m - 1)) + [(m - 1 if j < 0 else j + m) for j in p2[b].tolist()]])
        _, st_long = gdn_oracle(*cat, pcat, h0, slot[b:b + 1], 12 ** -0.5, True)
        torch.testing.assert_close(st2[b].cpu().double(), st_long[0, m:], rtol=1e-4, atol=1e-4)


@needs_triton
def test_commit_triton_equals_reference_bitwise(gen, dev):
    batch, n1 = 5, 9
    node_ssm = torch.randn(batch, n1, 3, 8, 16, generator=gen)
    node_conv = torch.randn(batch, n1, 70, 3, generator=gen).to(torch.bfloat16)
    ssm = torch.randn(11, 3, 8, 16, generator=gen)
    conv = torch.randn(11, 3, 70, generator=gen).to(torch.bfloat16).transpose(1, 2)  # SGLang strides
    slot = torch.randperm(11, generator=gen)[:batch]
    acc = torch.randint(0, n1, (batch,), generator=gen)
    slot[3] = -1
    acc[1] = -1
    outs = []
    for impl in ("torch", "triton"):
        s, c = ssm.clone().to(dev), conv.clone().to(dev)
        TR.commit_tree_states(s, c, *_to(dev, node_ssm, node_conv, acc, slot), impl=impl)
        outs.append((s.cpu(), c.cpu()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(outs[1][0][slot[0]], node_ssm[0, acc[0]])
    assert torch.equal(outs[1][0][slot[1]], ssm[slot[1]])  # accepted node -1: skipped



@pytest.mark.parametrize("impl", IMPLS)
def test_commit_all_layers_equals_per_layer_commit(impl, gen, dev):
    """One launch for every layer of a SGLang-shaped pool (leading layer axis, scratch rows past the batch, conv
    pool with SGLang's transposed strides) commits exactly what the single-layer commit does layer by layer."""
    layers, rows, batch, n1, slots = 3, 7, 4, 6, 9
    node_ssm = torch.randn(layers, rows, n1, 3, 8, 16, generator=gen)
    node_conv = torch.randn(layers, rows, n1, 40, 3, generator=gen).to(torch.bfloat16)
    ssm = torch.randn(layers, slots, 3, 8, 16, generator=gen)
    conv = torch.randn(layers, slots, 3, 40, generator=gen).to(torch.bfloat16).transpose(2, 3)
    slot = torch.randperm(slots, generator=gen)[:batch].to(torch.int32)
    acc = torch.randint(0, n1, (batch,), generator=gen)
    slot[2] = -1  # padded request
    acc[3] = -1  # nothing to commit
    s, c = ssm.clone().to(dev), conv.clone().to(dev)
    TR.commit_tree_states_layers(s, c, *_to(dev, node_ssm, node_conv, acc, slot), impl=impl)
    want_s, want_c = ssm.clone(), conv.clone()
    for layer in range(layers):
        TR.commit_tree_states(want_s[layer], want_c[layer], node_ssm[layer, :batch], node_conv[layer, :batch], acc,
                              slot, impl="torch")
    assert torch.equal(s.cpu(), want_s) and torch.equal(c.cpu(), want_c)
    assert torch.equal(want_s[:, int(slot[0])], node_ssm[:, 0, int(acc[0])])
    assert not torch.equal(want_s, ssm)
    with pytest.raises(ValueError, match="rows"):
        TR.commit_tree_states_layers(s, c, node_ssm[:, :2].to(dev), node_conv[:, :2].to(dev), *_to(dev, acc, slot))

def test_parent_order_check():
    TR.check_parent_order(as_parent([chain(5), wide(5), deep_with_siblings(5)]))
    with pytest.raises(ValueError, match="precede"):
        TR.check_parent_order(as_parent([[-1, 0, 3, 0]]))
    with pytest.raises(ValueError, match="precede"):
        TR.check_parent_order(as_parent([[-1, 1]]))


def test_max_budget_for_memory(gen):
    for _ in range(20):
        hv, kd, vd = (int(torch.randint(1, 64, (1,), generator=gen)) for _ in range(3))
        dim, kc = int(torch.randint(1, 9000, (1,), generator=gen)), int(torch.randint(2, 5, (1,), generator=gen))
        layers, batch = int(torch.randint(1, 40, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
        dtype = [torch.float32, torch.bfloat16][int(torch.randint(0, 2, (1,), generator=gen))]
        per = TR.per_node_state_bytes(hv, kd, vd, dim, kc, dtype, torch.bfloat16)
        assert per == hv * kd * vd * dtype.itemsize + dim * (kc - 1) * 2
        avail = int(torch.randint(0, 2**40, (1,), generator=gen))
        n = TR.max_budget_for_memory(avail, hv, kd, vd, dim, kc, dtype, num_layers=layers, batch=batch,
                                     conv_dtype=torch.bfloat16)
        unit = per * layers * batch
        if n < TR.MAX_TREE_NODES - 1:
            assert (n + 2) * unit > avail  # one more node would not fit
        if n >= 0:
            assert (n + 1) * unit <= avail
            TR.check_budget_memory(n, avail, hv, kd, vd, dim, kc, dtype, num_layers=layers, batch=batch,
                                   conv_dtype=torch.bfloat16)
        if n + 1 < TR.MAX_TREE_NODES - 1:
            with pytest.raises(ValueError, match="largest budget that fits"):
                TR.check_budget_memory(n + 1, avail, hv, kd, vd, dim, kc, dtype, num_layers=layers, batch=batch,
                                       conv_dtype=torch.bfloat16)
    # Qwen3-Next-80B: 32 value heads, K=V=128, conv dim 8192, width 4, fp32 SSM, bf16 conv, 36 GDN layers
    per = TR.per_node_state_bytes(32, 128, 128, 8192, 4, torch.float32, torch.bfloat16)
    assert per == 2 * 2**20 + 48 * 2**10
    assert TR.max_budget_for_memory(65 * per * 36, 32, 128, 128, 8192, 4, torch.float32, num_layers=36,
                                    conv_dtype=torch.bfloat16) == 64


def test_check_budget_bytes(gen):
    """The engine-level check: exact boundary on random sizes, and the message names the largest budget."""
    for _ in range(50):
        per = int(torch.randint(1, 2**30, (1,), generator=gen))
        avail = int(torch.randint(0, 2**40, (1,), generator=gen))
        n = TR.max_budget_for_bytes(avail, per)
        assert n == min(avail // per - 1, TR.MAX_TREE_NODES - 1)
        if 0 <= n:
            TR.check_budget_bytes(n, avail, per)
        if n + 1 < TR.MAX_TREE_NODES - 1:
            with pytest.raises(ValueError, match=f"largest budget that fits is {max(n, 0)}[ .]"):
                TR.check_budget_bytes(n + 1, avail, per, detail="x")
    with pytest.raises(ValueError, match=r"not even the root fits"):
        TR.check_budget_bytes(1, 10, 11)
    with pytest.raises(ValueError, match="bytes_per_node must be positive"):
        TR.max_budget_for_bytes(10, 0)


def test_shape_errors():
    p = as_parent([chain(3)])
    with pytest.raises(ValueError, match="g and beta"):
        TR.tree_gated_delta_rule(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4),
                                 torch.zeros(1, 3), torch.zeros(1, 3, 1), p, torch.zeros(1, 1, 4, 4),
                                 torch.zeros(1, dtype=torch.long), impl="torch")
    with pytest.raises(ValueError, match="conv_state"):
        TR.tree_causal_conv1d(torch.zeros(1, 3, 5), p, torch.zeros(1, 5, 2), torch.zeros(1, dtype=torch.long),
                              torch.zeros(5, 4), impl="torch")


# ------------------------------------------------------------------- compile for the GPU without a GPU

_AOT_SCRIPT = r"""
import importlib, importlib.util, sys
runtime_dir = sys.argv[1]
spec = importlib.util.spec_from_file_location("ddtree_runtime", runtime_dir + "/__init__.py",
                                              submodule_search_locations=[runtime_dir])
mod = importlib.util.module_from_spec(spec); sys.modules["ddtree_runtime"] = mod; spec.loader.exec_module(mod)
T = importlib.import_module("ddtree_runtime.tree_recurrent_triton")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def aot(fn, ptrs, consts, floats=()):
    sig, const = {}, {}
    for n in fn.arg_names:
        if n in ptrs:
            sig[n] = ptrs[n]
        elif n in consts:
            sig[n] = "constexpr"; const[(fn.arg_names.index(n),)] = consts[n]
        else:
            sig[n] = "fp32" if n in floats else "i32"
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32))
    assert "cubin" in k.asm
    return 1

n = 0
for ssm, conv in (("*fp32", "*bf16"), ("*bf16", "*bf16"), ("*fp32", "*fp32")):
    n += aot(T._commit_kernel, {"ssm_ptr": ssm, "cs_ptr": conv, "nssm_ptr": ssm, "nconv_ptr": conv,
                                "acc_ptr": "*i64", "slot_ptr": "*i32"}, {"W": 3, "BLOCK": 1024, "NS_CHUNKS": 16})
for act, bt, st, bv, rnd in (("*bf16", "*fp32", "*fp32", 8, False), ("*bf16", "*bf16", "*bf16", 32, True),
                             ("*fp32", "*fp32", "*fp32", 16, False)):
    ptrs = {k: act for k in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    ptrs.update(g_ptr="*fp32", beta_ptr=bt, parent_ptr="*i32", slot_ptr="*i64", h0_ptr="*fp32", hs_ptr=st)
    n += aot(T._tree_gdn_kernel, ptrs, {"N1": 16, "H": 16, "HV": 32, "K": 128, "V": 128, "BK": 128, "BV": bv,
                                       "L2NORM": True, "ROUND": rnd}, floats=("scale",))
# as the 0.5.17 hybrid glue launches it: Qwen3.6 heads (48 value heads over 16 key heads), budget 256, int32 slots
ptrs = {k: "*bf16" for k in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
ptrs.update(g_ptr="*fp32", beta_ptr="*fp32", parent_ptr="*i32", slot_ptr="*i32", h0_ptr="*fp32", hs_ptr="*fp32")
n += aot(T._tree_gdn_kernel, ptrs, {"N1": 257, "H": 16, "HV": 48, "K": 128, "V": 128, "BK": 128, "BV": 16,
                                   "L2NORM": True, "ROUND": False}, floats=("scale",))
for act, cs, bias in (("*bf16", "*bf16", True), ("*fp32", "*fp32", False)):
    ptrs = {"x_ptr": act, "parent_ptr": "*i32", "slot_ptr": "*i64", "cs_ptr": cs, "w_ptr": act, "bias_ptr": act,
            "y_ptr": act, "win_ptr": cs}
    n += aot(T._tree_conv_kernel, ptrs, {"KC": 4, "BD": 256, "HAS_BIAS": bias, "SILU": True})
print("compiled", n)
"""


def _can_aot() -> bool:
    try:
        from pathlib import Path

        import triton
        return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()
    except Exception:
        return False


@pytest.mark.skipif(not _can_aot(), reason="triton's NVIDIA backend (ptxas) is not installed")
def test_kernels_compile_for_sm90(tmp_path):
    """Full compile (TTIR -> cubin) of every kernel for sm_90 (H200), for the dtype mixes the integration uses,
    without a GPU. The interpreter does not type-check like the compiler: this caught a mixed-dtype branch in the
    commit kernel that the interpreter ran and the H200 rejected. Runs in a subprocess (no TRITON_INTERPRET)."""
    import os
    import subprocess
    import sys

    from rt_env import RUNTIME_DIR
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, str(RUNTIME_DIR)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "compiled 9" in r.stdout
