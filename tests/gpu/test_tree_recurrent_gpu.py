"""GPU check of the recurrent-state branching kernels at model shapes (Qwen3-Next-like heads, DDTree trees).

Pytest tests, marked ``gpu`` and skipped without CUDA: ``python -m pytest -m gpu tests/gpu/test_tree_recurrent_gpu.py``
(or ``make test-gpu``); ``DDTREE_GPU_DRYRUN=1 TRITON_INTERPRET=1`` in front runs them on CPU at small shapes.
The oracle is independent of the tree code: every node's root->node path is run as an ordinary chain in float64
(all nodes at once, one step per depth).
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_DIR = ROOT / "patches" / "ddtree" / "runtime"
sys.path.insert(0, str(ROOT))


def load_runtime(name: str = "ddtree_runtime"):
    """The runtime package (by path, as overlays vendor it) and its tree_recurrent module."""
    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime as load_runtime_dir

    return load_runtime_dir(RUNTIME_DIR, module_name=name), importlib.import_module(f"{name}.tree_recurrent")


# DDTREE_GPU_DRYRUN=1 runs the same checks on CPU through the Triton interpreter at small shapes (to try the
# tests without a GPU); the real run uses model shapes on CUDA.
DRY = os.environ.get("DDTREE_GPU_DRYRUN") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not DRY and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device (DDTREE_GPU_DRYRUN=1 tries it on CPU)")]
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEV = "cpu" if DRY else "cuda"
S = (dict(budget=9, heads=2, hv=4, kd=16, vd=16, dim=40, small_budget=5, batch=5) if DRY else
     dict(budget=63, heads=16, hv=32, kd=128, vd=128, dim=6144, small_budget=15, batch=8))

SEED = int(os.environ.get("DDTREE_TEST_SEED", str(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)))


def _gen(k: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(SEED * 131 + k)
    return g


def draft_parents(rt, gen, batch, budget, depth=15, vocab=64):
    logits = torch.randn(batch, depth, vocab, generator=gen) * 2.0
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return rt.build_tree(lp, tok, roots, budget, impl="torch").parent


def path_matrix(parent: torch.Tensor):
    """paths [B, N1, Dmax] (node ids root..node, left-aligned, -1 padded) and lengths [B, N1]."""
    batch, n1 = parent.shape
    rows, lens = [], []
    for b in range(batch):
        pr = parent[b].tolist()
        for i in range(n1):
            p = [i]
            while pr[p[-1]] >= 0:
                p.append(pr[p[-1]])
            rows.append(p[::-1])
            lens.append(len(p))
    dmax = max(lens)
    out = torch.full((batch * n1, dmax), -1, dtype=torch.long)
    for r, p in enumerate(rows):
        out[r, :len(p)] = torch.tensor(p)
    return out.view(batch, n1, dmax), torch.tensor(lens).view(batch, n1)


def gdn_path_oracle(q, k, v, g, beta, parent, h0, slot, scale, l2norm):
    """float64 chain recurrence along every node's path, all nodes in parallel (one step per depth)."""
    dev = q.device
    batch, n1, heads, kd = q.shape
    hv, vd = v.shape[2:]
    rep = hv // heads
    paths, lens = (t.to(dev) for t in path_matrix(parent.cpu()))
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    q, k = q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2)
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    h = h0[slot.clamp(min=0)].double() * (slot >= 0).double().view(-1, 1, 1, 1)
    h = h[:, None].expand(batch, n1, hv, vd, kd).clone()
    o = torch.zeros(batch, n1, hv, vd, dtype=torch.float64, device=dev)
    bi = torch.arange(batch, device=dev)[:, None].expand(batch, n1)
    for t in range(paths.shape[2]):
        act = (t < lens)
        j = paths[:, :, t].clamp(min=0)
        kk, qq, vv = k[bi, j], q[bi, j], v[bi, j]
        gg, bb = g[bi, j], beta[bi, j]
        hn = h * torch.exp(gg)[..., None, None]
        vn = bb[..., None] * (vv - (hn * kk[..., None, :]).sum(-1))
        hn = hn + vn[..., None] * kk[..., None, :]
        h = torch.where(act[..., None, None, None], hn, h)
        last = (t == lens - 1)
        o = torch.where(last[..., None, None], (hn * (qq * scale)[..., None, :]).sum(-1), o)
    return o, h


def conv_path_oracle(x, parent, cs, slot, weight, bias, silu):
    batch, n1, dim = x.shape
    kc = weight.shape[1]
    paths, lens = path_matrix(parent.cpu())
    dev = x.device
    init = cs[slot.clamp(min=0), :, :kc - 1].double() * (slot >= 0).double().view(-1, 1, 1)  # [B, D, w]
    seqs = torch.zeros(batch, n1, dim, kc, dtype=torch.float64, device=dev)
    for b in range(batch):
        for i in range(n1):
            p = paths[b, i, :int(lens[b, i])].to(dev)
            seq = torch.cat([init[b], x[b, p].double().T], dim=1)
            seqs[b, i] = seq[:, -kc:]
    acc = (seqs * weight.double()).sum(-1)
    if bias is not None:
        acc = acc + bias.double()
    if silu:
        acc = acc * torch.sigmoid(acc)
    return acc, seqs[..., 1:]


def _inputs(gen, parent, heads, hv, kd, vd, slots, dtype):
    batch, n1 = parent.shape
    q = torch.randn(batch, n1, heads, kd, generator=gen)
    k = torch.randn(batch, n1, heads, kd, generator=gen)
    v = torch.randn(batch, n1, hv, vd, generator=gen)
    g = -torch.rand(batch, n1, hv, generator=gen) * 0.3
    beta = torch.rand(batch, n1, hv, generator=gen)
    h0 = torch.randn(slots, hv, vd, kd, generator=gen) * 0.1
    slot = torch.randperm(slots, generator=gen)[:batch]
    return [t.to(dtype).to(DEV) for t in (q, k, v, g, beta)] + [h0.to(DEV), slot.to(DEV)]


def test_gdn_model_shapes_vs_float64_paths():
    rt, tr = load_runtime()
    gen = _gen(1)
    budget = S["budget"]
    parent = torch.cat([draft_parents(rt, gen, 3, budget),
                        torch.tensor([[-1] + list(range(budget))], dtype=torch.int32),   # chain
                        torch.tensor([[-1] + [0] * budget], dtype=torch.int32)])          # wide
    q, k, v, g, beta, h0, slot = _inputs(gen, parent, S["heads"], S["hv"], S["kd"], S["vd"], 9,
                                         torch.float32)
    slot[1] = -1
    pc = parent.to(DEV)
    o, st = tr.tree_gated_delta_rule(q, k, v, g, beta, pc, h0, slot, use_qk_l2norm=True, impl="triton")
    o_ref, st_ref = gdn_path_oracle(q, k, v, g, beta, pc, h0, slot, S["kd"] ** -0.5, True)
    torch.testing.assert_close(st.double(), st_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(o.double(), o_ref, rtol=1e-4, atol=1e-4)
    o_t, st_t = tr.tree_gated_delta_rule(q, k, v, g, beta, pc, h0, slot, use_qk_l2norm=True, impl="torch")
    torch.testing.assert_close(st, st_t, rtol=1e-5, atol=1e-5)


def test_gdn_bf16_small_batch_vs_reference():
    rt, tr = load_runtime()
    gen = _gen(2)
    parent = draft_parents(rt, gen, 1, S["small_budget"]).to(DEV)  # batch 1: smallest V blocks
    q, k, v, g, beta, h0, slot = _inputs(gen, parent, S["heads"], S["heads"], S["kd"], S["vd"], 2, torch.bfloat16)
    for sd in (torch.float32, torch.bfloat16):
        o, st = tr.tree_gated_delta_rule(q, k, v, g, beta, parent, h0, slot, use_qk_l2norm=True, state_dtype=sd,
                                         impl="triton")
        o_t, st_t = tr.tree_gated_delta_rule(q, k, v, g, beta, parent, h0, slot, use_qk_l2norm=True,
                                             state_dtype=sd, impl="torch")
        tol = 1e-4 if sd == torch.float32 else 2e-2
        torch.testing.assert_close(st.float(), st_t.float(), rtol=tol, atol=tol)
        torch.testing.assert_close(o.float(), o_t.float(), rtol=2e-2, atol=2e-2)
        o_ref, st_ref = gdn_path_oracle(q, k, v, g, beta, parent, h0, slot, S["kd"] ** -0.5, True)
        torch.testing.assert_close(st.double(), st_ref, rtol=3e-2, atol=3e-2)


def test_conv_model_shapes_vs_float64_paths():
    rt, tr = load_runtime()
    gen = _gen(3)
    parent = draft_parents(rt, gen, 4, S["small_budget"]).to(DEV)
    dim, kc = S["dim"], 4
    x = torch.randn(4, S["small_budget"] + 1, dim, generator=gen).to(DEV)
    cs = torch.randn(6, kc - 1, dim, generator=gen).to(DEV).transpose(1, 2)  # SGLang: D contiguous
    w = torch.randn(dim, kc, generator=gen).to(DEV)
    bias = torch.randn(dim, generator=gen).to(DEV)
    slot = torch.randperm(6, generator=gen)[:4].to(DEV)
    y, win = tr.tree_causal_conv1d(x, parent, cs, slot, w, bias, "silu", impl="triton")
    y_ref, win_ref = conv_path_oracle(x, parent, cs, slot, w, bias, True)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(win.double(), win_ref)
    xb, csb, wb = x.bfloat16(), cs.bfloat16(), w.bfloat16()
    yb, winb = tr.tree_causal_conv1d(xb, parent, csb, slot, wb, None, "silu", impl="triton")
    yr, winr = tr.tree_causal_conv1d(xb, parent, csb, slot, wb, None, "silu", impl="torch")
    assert torch.equal(winb, winr)
    torch.testing.assert_close(yb.float(), yr.float(), rtol=1e-2, atol=1e-2)


def test_commit_bitwise_and_drift_free():
    rt, tr = load_runtime()
    gen = _gen(4)
    batch, budget = S["batch"], S["small_budget"]
    parent = draft_parents(rt, gen, batch, budget).to(DEV)
    q, k, v, g, beta, h0, slot = _inputs(gen, parent, S["heads"], S["heads"], S["kd"], S["vd"], 40, torch.bfloat16)
    _, st = tr.tree_gated_delta_rule(q, k, v, g, beta, parent, h0, slot, use_qk_l2norm=True,
                                     state_dtype=torch.bfloat16, impl="triton")
    x = torch.randn(batch, budget + 1, 512, generator=gen).bfloat16().to(DEV)
    cs = torch.randn(40, 3, 512, generator=gen).bfloat16().to(DEV).transpose(1, 2)
    w = torch.randn(512, 4, generator=gen).bfloat16().to(DEV)
    _, win = tr.tree_causal_conv1d(x, parent, cs, slot, w, impl="triton")
    acc = torch.randint(0, budget + 1, (batch,), generator=gen).to(DEV)
    acc[2] = -1
    slot2 = slot.clone()
    slot2[1] = -1
    pools = []
    for impl in ("torch", "triton"):
        s, c = h0.clone(), cs.clone()
        tr.commit_tree_states(s, c, st, win, acc, slot2, impl=impl)
        pools.append((s, c))
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])
    for b in (0, batch - 1):
        assert torch.equal(pools[1][0][slot[b]], st[b, acc[b]]) and torch.equal(pools[1][1][slot[b]], win[b, acc[b]])
    # Drift check: replay every request's accepted path as a plain chain (same batch shape, so the same
    # kernel configuration) and require the bf16 state to be bit-identical to the state the tree verify kept.
    paths, lens = path_matrix(parent.cpu())
    a = acc.clamp(min=0).cpu()
    dmax = int(lens.max())
    rows = torch.zeros(batch, dmax, dtype=torch.long)
    for b in range(batch):
        p = paths[b, a[b], :int(lens[b, a[b]])]
        rows[b, :p.numel()] = p
        rows[b, p.numel():] = p[-1]  # filler after the path end: later chain nodes do not change earlier states
    rows = rows.to(DEV)
    bi = torch.arange(batch, device=DEV)[:, None]
    sub = [t[bi, rows] for t in (q, k, v, g, beta)]
    chain = torch.tensor([[-1] + list(range(dmax - 1))] * batch, dtype=torch.int32, device=DEV)
    _, st_chain = tr.tree_gated_delta_rule(*sub, chain, h0, slot, use_qk_l2norm=True, state_dtype=torch.bfloat16,
                                           impl="triton")
    for b in range(batch):
        n = int(lens[b, a[b]])
        assert torch.equal(st_chain[b, n - 1], st[b, a[b]]), f"request {b}: chain replay differs from the tree state"

