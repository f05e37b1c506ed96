"""SGLang 0.5.17 patch 0004: DDTree's tree verify of GatedDeltaNet layers as wired, against float64 per-path recurrences.

What runs is the patched SGLang itself: the real ``GDNAttnBackend`` (its ``init_cuda_graph_state``, the graph-replay
metadata ``init_forward_metadata_out_graph`` or the eager ``init_forward_metadata``, then ``forward_extend`` in
TARGET_VERIFY, which patch 0004 hands to ``ddtree_v2.hybrid.TreeVerify``: the DDTree runtime's tree conv1d and tree
gated delta rule) and the real ``DFlashWorkerV2._update_target_mamba_state_after_verify`` (the base's prefix-cache
tracking rule, then ``ddtree_v2.hybrid.commit``). Only the memory pool is a stand-in (SGLang's ``MambaPool`` puts its
scratch on "cuda" unconditionally): the same tensors, in the same layouts (``temporal`` [L, slots, HV, V, K], conv
[L, slots, D, K-1], dense per-node scratch [L, rows, N1, ...]).

Per case (budget, batch, tree kind, eager or graph replay with padded rows, two GDN layers):
1. trees from the runtime (``draft_topk`` -> ``build_tree``) from random, tied or chain-forcing draft logits;
2. the verify; every node's output, SSM state and conv window against a float64 recurrence along the node's own
   root->node path (conv output rounded to the model dtype where the kernels round it);
3. the walk (runtime ``accept_walk``, target tokens steering it onto a chosen path), then the commit: each request's
   slot holds the accepted node's state and window, equal to running the same verify over the accepted path as a plain
   chain; the prefix-cache track slot holds the node at the base's tracked step; padded requests and other slots are
   untouched.

Shapes: Qwen3.6-27B's GDN layers (16 key heads, 48 value heads, head dims 128, conv kernel 4; conv dim 10240) on the
GPU (bfloat16 activations, float32 SSM states); ``--cpu-smoke`` keeps the head dims and the 3:1 value/key head ratio
with 1 key head, through the Triton interpreter, in float32 (see :func:`model_dtype`). Budgets 1/16/64/256, batches
up to 16.

On the GPU host (the patched sglang importable, e.g. after ``bench/e2e/gpu_run.sh`` built the overlay):
    PYTHONPATH=/tmp/overlay:/tmp/site python3 tests/gpu/test_hybrid_v2_kernels_gpu.py --out hybrid_v2_kernels.json
prints PASS/FAIL lines, exits 1 on any failure. ``tests/sglang_v2/test_hybrid_v2.py`` runs it with ``--cpu-smoke``.
"""
from __future__ import annotations

import os
import sys

if "--cpu-smoke" in sys.argv:  # before triton is imported: kernels are decorated for the interpreter then
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("DDTREE_HYBRID_IMPL", "triton")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402

try:
    import pytest
except ImportError:  # plain-script mode
    pytest = None

if pytest is not None:
    pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

#: Qwen3.6-27B (and Qwen3.5-27B) GatedDeltaNet shapes per layer at TP 1, from its config (text_config).
QWEN36 = dict(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128, conv_kernel=4)
CPU = dict(QWEN36, num_k_heads=1, num_v_heads=3)
SEED = int(os.environ.get("DDTREE_TEST_SEED", "20261201"))
DEPTH = 15  # the Qwen3.6 drafter's block 16: draft depths 1..15


@dataclass(frozen=True)
class Case:
    budget: int
    batch: int
    kind: str = "draft"  # draft | ties | chain
    graph: bool = False  # the graph-replay metadata path (fixed buffers), with `pad` padded rows
    pad: int = 0
    track: bool = False  # a prefix-cache track slot per request (extra_buffer)

    @property
    def name(self) -> str:
        return (f"b{self.budget}-bs{self.batch}-{self.kind}-{'graph' if self.graph else 'eager'}"
                + (f"-pad{self.pad}" if self.pad else "") + ("-track" if self.track else ""))


#: GPU: every budget at batch 1 and at a large batch (budget 256 at batch 8: its per-node scratch for two layers is
#: already 14 GB next to the servers sharing the GPU), eager and graph replay with padded rows, ties, the deepest
#: chain, track slots.
GPU_CASES = [Case(1, 1), Case(1, 16, graph=True, pad=2), Case(16, 1, "chain"), Case(16, 16, graph=True, pad=3),
             Case(16, 4, "ties", track=True), Case(64, 1, graph=True), Case(64, 16, "draft", track=True),
             Case(64, 8, "ties", graph=True, pad=1), Case(256, 1, "chain", graph=True), Case(256, 4),
             Case(256, 8, graph=True, track=True)]
#: CPU (interpreted): every budget once, batch 8 at budget 1 (batch 16 is the GPU's; interpreted, each request's
#: programs cost about 1.5 s), the deepest chain with a track slot, ties with padded graph rows, budget 256 as one
#: small case.
CPU_CASES = [Case(1, 8, graph=True, pad=2), Case(16, 2, "chain", track=True), Case(16, 3, "ties", graph=True, pad=1),
             Case(64, 2, graph=True, track=True), Case(256, 1)]


# ------------------------------------------------------------------------------------------------ base classes


def base():
    """The patched SGLang's classes this check drives (imported late: they need the patched tree on the path)."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid_mod
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.radix_linear_attention import RadixLinearAttention
    from sglang.srt.mem_cache.memory_pool import MambaPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import ddtree as rt
    from sglang.srt.speculative import dflash_worker_v2
    from sglang.srt.speculative.ddtree_v2 import hybrid
    from sglang.srt.speculative.ddtree_v2.verify_input import DDTreeVerifyInput

    return SimpleNamespace(GDN=GDNAttnBackend, Hybrid=hybrid_mod.HybridLinearAttnBackend,
                           Base=hybrid_mod.MambaAttnBackendBase, Layer=RadixLinearAttention, MambaPool=MambaPool,
                           ForwardMode=ForwardMode, rt=rt, worker_mod=dflash_worker_v2, hybrid=hybrid,
                           VerifyInput=DDTreeVerifyInput)


class Pool:
    """The hybrid request pool's surface the backend and the commit read, over SGLang-layout tensors."""

    def __init__(self, B, *, layers, slots, rows, n1, shapes, device, dtype):
        hv, vd, kd = shapes["num_v_heads"], shapes["head_v_dim"], shapes["head_k_dim"]
        dim = 2 * shapes["num_k_heads"] * kd + hv * vd
        w = shapes["conv_kernel"] - 1
        g = torch.Generator(device="cpu").manual_seed(SEED + 17)
        self.size = slots
        self.temporal = (torch.randn(layers, slots + 1, hv, vd, kd, generator=g) * 0.1).to(device)
        self.conv = [torch.randn(layers, slots + 1, dim, w, generator=g).to(dtype).to(device)]
        if B.hybrid.gdn_verify_mode() == "chunk":  # what patch 0004's MambaPool hook allocates in chunk mode
            self.inter_ssm = torch.zeros(layers, rows, n1, hv, B.rt.record_width(kd, vd), device=device)
        else:
            self.inter_ssm = torch.zeros(layers, rows, n1, hv, vd, kd, device=device)
        self.inter_conv = [torch.zeros(layers, rows, n1, dim, w, dtype=dtype, device=device)]
        self.mapping = torch.randperm(slots, generator=g).to(torch.int32).to(device)  # request pool index -> slot
        self.mamba_pool = SimpleNamespace(enable_linear_replayssm=False, enable_linear_replayssm_spec=False,
                                          replayssm_write_pos=None)
        self.B = B

    def state(self, layer=None):
        sl = (lambda t: t) if layer is None else (lambda t: t[layer])
        return self.B.MambaPool.SpeculativeState(
            conv=[sl(self.conv[0])], temporal=sl(self.temporal), intermediate_ssm=sl(self.inter_ssm),
            intermediate_conv_window=[sl(self.inter_conv[0])], replayssm_d=None, replayssm_k=None, replayssm_g=None,
            replayssm_rawv=None, replayssm_rawk=None, replayssm_beta=None)

    def mamba2_layer_cache(self, layer_id):
        return self.state(self.layer_index[layer_id])

    def get_speculative_mamba2_params_all_layers(self):
        return self.state()

    def get_mamba_indices(self, req_pool_indices):
        return self.mapping[req_pool_indices.long()]

    def translate_mamba_indices(self, idx):
        return idx


# ------------------------------------------------------------------------------------------------ oracle


def paths(parent_row: list[int]) -> list[list[int]]:
    out = []
    for i in range(len(parent_row)):
        p, j = [], i
        while j >= 0:
            p.append(j)
            j = parent_row[j]
        out.append(p[::-1])
    return out


def oracle(x, a, b, parent, h0, win0, layer, shapes, out_dtype):
    """float64 per path, one request: node i's conv output, SSM state, window and GDN output from the committed
    state along root..i only. x [N1, D] (model dtype), a/b [N1, HV], h0 [HV, V, K], win0 [D, K-1]."""
    n1, dim = x.shape
    hk, hv, kd, vd = shapes["num_k_heads"], shapes["num_v_heads"], shapes["head_k_dim"], shapes["head_v_dim"]
    kc = shapes["conv_kernel"]
    ps = paths(parent.tolist())
    steps = max(len(p) for p in ps)
    idx = torch.full((n1, steps), -1, dtype=torch.long)
    for i, p in enumerate(ps):
        idx[i, : len(p)] = torch.tensor(p)
    last = torch.tensor([len(p) - 1 for p in ps])
    dev = x.device
    idx, last = idx.to(dev), last.to(dev)
    w32 = layer.conv_weights.float()
    A = torch.exp(layer.A_log.double())  # noqa: N806
    dtb = layer.dt_bias.double()
    h = h0.double().unsqueeze(0).repeat(n1, 1, 1, 1)
    win = win0.double().unsqueeze(0).repeat(n1, 1, 1)  # [N1, D, K-1], oldest first
    out = torch.zeros(n1, hv, vd, dtype=torch.float64, device=dev)
    st = torch.zeros_like(h)
    wn = torch.zeros_like(win)
    for t in range(steps):
        node = idx[:, t]
        live = node >= 0
        nd = node.clamp(min=0)
        xin = x[nd].double()  # [N1, D]
        seq = torch.cat([win, xin.unsqueeze(-1)], dim=-1)  # [N1, D, K]
        # The conv stage's output is a tensor in the model dtype: computed here as the kernel does (fp32, newest
        # input first, then SiLU) and rounded once, so that the float64 recurrence below starts from the same q/k/v.
        acc = torch.zeros(n1, dim, dtype=torch.float32, device=dev)
        for j in range(kc):
            acc = acc + seq[..., kc - 1 - j].float() * w32[:, kc - 1 - j]
        y = (acc / (1.0 + torch.exp(-acc))).to(out_dtype).double()
        q = y[:, : hk * kd].view(n1, hk, kd)
        k = y[:, hk * kd: 2 * hk * kd].view(n1, hk, kd)
        v = y[:, 2 * hk * kd:].view(n1, hv, vd)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        rep = hv // hk
        q = q.repeat_interleave(rep, 1) * kd ** -0.5
        k = k.repeat_interleave(rep, 1)
        sp = torch.nn.functional.softplus(a[nd].double() + dtb, beta=1.0, threshold=20.0)
        g = torch.exp(-A * sp)  # [N1, HV]
        beta = torch.sigmoid(b[nd].double())
        hn = h * g[:, :, None, None]
        vn = (v - torch.einsum("nhvk,nhk->nhv", hn, k)) * beta[..., None]
        hn = hn + vn[..., None] * k[:, :, None, :]
        o = torch.einsum("nhvk,nhk->nhv", hn, q)
        m = live[:, None, None, None]
        h = torch.where(m, hn, h)
        win = torch.where(live[:, None, None], seq[..., 1:], win)
        done = (last == t)
        out[done], st[done], wn[done] = o[done], h[done], win[done]
    return out, st, wn


def node_states(B, gdn, pool, li: int, r: int, h0: torch.Tensor) -> torch.Tensor:
    """Every node's SSM state of request row r, layer li, float64 [N1, HV, V, K]: the per-node scratch itself in
    "recurrent" mode; in "chunk" mode rebuilt from the node records (u, normalised k, path log decay G) and the
    committed state h0 along each node's ancestors, h_i = exp(G_i) h0 + sum_j anc[i, j] exp(G_i - G_j) u_j k_j^T."""
    scratch = pool.inter_ssm[li, r].double()
    if gdn.ddtree.mode != "chunk":
        return scratch
    vd, kd = h0.shape[-2], h0.shape[-1]
    u, k, g = scratch[..., :vd], scratch[..., vd:vd + kd], scratch[..., vd + kd]  # [N1, HV, *]
    anc = gdn.ddtree.anc[r].double()  # [N1, N1]
    w = anc[:, :, None] * torch.exp((g[:, None, :] - g[None, :, :]).clamp(max=0))  # [i, j, HV]
    return torch.exp(g)[..., None, None] * h0.double() + torch.einsum("ijh,jhv,jhk->ihvk", w, u, k)


def same_state(gdn, got: torch.Tensor, want: torch.Tensor) -> bool:
    """A committed state against the node's: bit-equal in "recurrent" mode (a copy); in "chunk" mode (rebuilt by
    the commit kernel from the same records, sums in another order) within float32 rounding."""
    if gdn.ddtree.mode != "chunk":
        return bool(torch.equal(got, want))
    return float((got.double() - want.double()).abs().max()) <= 1e-5 * (float(want.abs().max()) + 1)


# ------------------------------------------------------------------------------------------------ one case


def make_trees(B, rt, case, batch, device, gen):
    n1 = case.budget + 1
    vocab = 64
    if case.kind == "ties":
        logits = torch.zeros(batch, DEPTH, vocab)
    elif case.kind == "chain":  # one dominant token per depth: the 15-deep chain is built first
        logits = torch.full((batch, DEPTH, vocab), -30.0)
        logits[:, :, 3] = 0.0
        logits += torch.rand(batch, DEPTH, vocab, generator=gen) * 0.1
    else:
        logits = torch.randn(batch, DEPTH, vocab, generator=gen) * 2.0
    lp, tok = rt.draft_topk(logits, min(case.budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    tree = rt.build_tree(lp, tok, roots, case.budget, impl="torch")
    tree = type(tree)(**{f: (getattr(tree, f).to(device) if torch.is_tensor(getattr(tree, f)) else getattr(tree, f))
                         for f in tree.__dataclass_fields__})
    assert tree.parent.shape == (batch, n1)
    return tree


def walk_to(rt, tree, gen, vocab=64, deepest=False):
    """Target tokens that make the walk accept the path to a random node of each request (``deepest``: to its
    deepest node, the longest accept the drafter allows)."""
    parent = tree.parent.cpu()
    token = tree.token.cpu()
    batch, n1 = parent.shape
    target = torch.randint(0, vocab, (batch, n1), generator=gen)
    chosen = []
    for b in range(batch):
        valid = int(tree.num_nodes[b])
        node = int(torch.randint(0, valid, (1,), generator=gen))
        if deepest:
            node = int(tree.depth[b, :valid].cpu().argmax())
        p = paths(parent[b].tolist())[node]
        for u, w in zip(p[:-1], p[1:], strict=True):
            target[b, u] = token[b, w]
        children = set(token[b][parent[b] == node].tolist())
        target[b, node] = next(t for t in range(vocab + 100, vocab + 200) if t not in children)
        chosen.append(p)
    walk = rt.accept_walk(tree, target.to(tree.parent.device), impl="torch")
    return walk, chosen


def gdn_backend(B, *, budget: int, layer_ids: list[int], slots: int, rows: int, shapes: dict, device: str, dtype):
    """The patched ``GDNAttnBackend`` as a model runner makes it (the base's own set-up of the mamba backend state,
    then what patch 0004's ``__init__`` attaches) over a ``Pool`` of one recurrent layer per id; (backend, pool)."""
    pool = Pool(B, layers=len(layer_ids), slots=slots, rows=rows, n1=budget + 1, shapes=shapes, device=device,
                dtype=dtype)
    pool.layer_index = {lid: i for i, lid in enumerate(layer_ids)}
    args = SimpleNamespace(speculative_eagle_topk=None, enable_unified_memory=False, speculative_ddtree_budget=budget,
                           speculative_num_draft_tokens=budget + 1)
    runner = SimpleNamespace(device=device, server_args=args, is_draft_worker=False, req_to_token_pool=pool,
                             token_to_kv_pool=None)
    gdn = object.__new__(B.GDN)
    B.Base.__init__(gdn, runner)
    gdn.verify_intermediate_state_indices = torch.arange(rows, dtype=torch.int32, device=device)
    gdn.ddtree = B.hybrid.TreeVerify.attach(gdn, runner)
    return gdn, pool


def gdn_layer(B, layer_id: int, shapes: dict, gen: torch.Generator, device: str, dtype):
    """A GatedDeltaNet layer of the given shapes with random weights drawn from ``gen``."""
    hv, vd, kd, hk = shapes["num_v_heads"], shapes["head_v_dim"], shapes["head_k_dim"], shapes["num_k_heads"]
    dim = 2 * hk * kd + hv * vd
    return B.Layer(layer_id=layer_id, num_q_heads=hk, num_k_heads=hk, num_v_heads=hv, head_q_dim=kd, head_k_dim=kd,
                   head_v_dim=vd, conv_weights=(torch.randn(dim, shapes["conv_kernel"], generator=gen) * 0.4)
                   .to(dtype).to(device), bias=None, activation="silu",
                   A_log=torch.randn(hv, generator=gen).to(device),
                   dt_bias=(torch.randn(hv, generator=gen) * 0.5).to(dtype).to(device))


def run_case(B, case: Case, shapes: dict, device: str, dtype=torch.bfloat16) -> dict:
    rt, hybrid = B.rt, B.hybrid
    gen = torch.Generator().manual_seed(SEED + zlib.crc32(case.name.encode()) % 100000)
    batch, n1 = case.batch, case.budget + 1
    bs = batch + case.pad  # what the graph runner replays
    hv, vd, kd, hk = shapes["num_v_heads"], shapes["head_v_dim"], shapes["head_k_dim"], shapes["num_k_heads"]
    dim = 2 * hk * kd + hv * vd
    slots = 2 * bs + 4  # room for a track slot per request besides the requests' own
    layer_ids = [4, 9]
    layers = len(layer_ids)
    gdn, pool = gdn_backend(B, budget=case.budget, layer_ids=layer_ids, slots=slots, rows=bs + 1, shapes=shapes,
                            device=device, dtype=dtype)
    tree = make_trees(B, rt, case, batch, device, gen)
    req_pool = torch.randperm(slots, generator=gen)[:bs].to(device)
    spec = B.VerifyInput(draft_token=tree.token.reshape(-1), positions=None, draft_token_num=n1, custom_mask=None,
                         tree=tree)
    fb = SimpleNamespace(batch_size=bs if case.graph else batch, req_pool_indices=req_pool.clone() if case.graph
                         else req_pool[:batch].clone(), forward_mode=B.ForwardMode.TARGET_VERIFY, spec_info=spec,
                         seq_lens_cpu=None, num_padding=case.pad, mamba_track_indices=None, mamba_track_mask=None,
                         _original_batch_size=None, input_ids=torch.zeros((bs if case.graph else batch) * n1,
                                                                          dtype=torch.int64, device=device))
    if case.graph:
        gdn.init_cuda_graph_state(bs, bs * n1)
        gdn.init_forward_metadata_out_graph(fb)  # replay prep: fixed buffers, padded rows -> slot -1
        rows = bs
    else:
        gdn.init_forward_metadata(fb)
        rows = batch
    slot_of = gdn.forward_metadata.mamba_cache_indices[:rows].clone()
    want_slots = pool.mapping[req_pool[:batch].long()]
    assert torch.equal(slot_of[:batch].long().cpu(), want_slots.long().cpu()), "mamba slots of the real requests"
    if case.pad:
        assert bool((slot_of[batch:] < 0).all()), "padded rows must carry slot -1"
    assert torch.equal(gdn.ddtree.parent[:batch].cpu(), tree.parent.cpu()), "parents copied into the fixed buffer"

    x = (torch.randn(rows * n1, dim, generator=gen) * 0.7).to(dtype).to(device)
    a = torch.randn(rows * n1, hv, generator=gen).to(dtype).to(device)
    bb = torch.randn(rows * n1, hv, generator=gen).to(dtype).to(device)
    lay = [gdn_layer(B, lid, shapes, gen, device, dtype) for lid in layer_ids]
    temporal0, conv0 = pool.temporal.clone(), pool.conv[0].clone()
    res = {"case": case.name, "max_out_err": 0.0, "max_state_err": 0.0, "window_exact": True}
    t0 = time.perf_counter()
    outs = []
    for layer in lay:
        o = gdn.forward_extend(layer, fb, mixed_qkv=x, a=a, b=bb)  # patch 0004 -> TreeVerify.forward
        assert tuple(o.shape) == (1, rows * n1, hv, vd) and o.dtype == dtype
        outs.append(o)
    if device == "cuda":
        torch.cuda.synchronize()
    res["verify_s"] = round(time.perf_counter() - t0, 3)
    assert torch.equal(pool.temporal, temporal0) and torch.equal(pool.conv[0], conv0), "verify must not touch the pool"
    ref_state, node_state = {}, {}
    for li, layer in enumerate(lay):
        for r in range(batch):
            s = int(slot_of[r])
            sl = slice(r * n1, (r + 1) * n1)
            o_ref, st_ref, win_ref = oracle(x[sl], a[sl], bb[sl], tree.parent[r].cpu(), temporal0[li, s],
                                            conv0[li, s], layer, shapes, dtype)
            ref_state[(li, r)] = (st_ref, win_ref)
            got_o = outs[li][0, sl].double()
            err_o = float((got_o - o_ref).abs().max() / (o_ref.abs().max() + 1e-6))
            got_s = node_states(B, gdn, pool, li, r, temporal0[li, s])
            node_state[(li, r)] = got_s
            err_s = float((got_s - st_ref).abs().max() / (st_ref.abs().max() + 1e-6))
            res["max_out_err"] = max(res["max_out_err"], err_o)
            res["max_state_err"] = max(res["max_state_err"], err_s)
            res["window_exact"] &= bool(torch.equal(pool.inter_conv[0][li, r].double(), win_ref))
    # Errors relative to the tensor's largest magnitude. fp32 activations: 1e-4. bf16 activations: the kernel and the
    # oracle both round the conv output (q, k, v) to bf16 from fp32 sums taken in other orders, so an element can
    # land one bf16 ulp apart, and that carries into every later state and output of the path at up to about one
    # ulp relative (gates <= 1, k normalised): states within one bf16 ulp (2^-7), outputs (stored in bf16) 2e-2.
    bf16_ulp = torch.finfo(torch.bfloat16).eps
    out_tol, state_tol = (2e-2, bf16_ulp) if dtype == torch.bfloat16 else (1e-4, 1e-4)
    res["ok_verify"] = res["max_out_err"] < out_tol and res["max_state_err"] < state_tol and res["window_exact"]

    # walk + commit through the real worker method (base tracking rule, then ddtree_v2.hybrid.commit)
    walk, chosen = walk_to(rt, tree, gen, deepest=case.kind == "chain")
    got_paths = [[int(v) for v in row if v >= 0] for row in walk.accepted_nodes.cpu()]
    res["walk_follows_path"] = got_paths == chosen
    commit_lens = (walk.accept_len + 1).to(torch.int32)
    worker = object.__new__(B.worker_mod.DFlashWorkerV2)
    worker._need_mamba_verify_commit = True
    backend = object.__new__(B.Hybrid)
    backend.linear_attn_backend = gdn
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=backend, model=None))
    interval = 4
    pre = torch.randint(10, 40, (batch,), generator=gen)
    post = pre + commit_lens.cpu().long()
    track = None
    if case.track:
        used = set(want_slots.tolist())
        spare = [s for s in torch.randperm(slots, generator=gen).tolist() if s not in used]
        track = torch.tensor(spare[:batch], dtype=torch.int64, device=device)
    batch_ns = SimpleNamespace(mamba_track_indices=track, seq_lens=post.to(device),
                               req_pool_indices=req_pool[:batch])
    saved_exec = B.worker_mod.get_exec
    B.worker_mod.get_exec = lambda: SimpleNamespace(mamba=SimpleNamespace(mamba_track_interval=interval))
    try:
        before_t, before_c = pool.temporal.clone(), pool.conv[0].clone()
        worker._update_target_mamba_state_after_verify(batch=batch_ns, seq_lens_pre_verify=pre.to(device),
                                                        commit_lens=commit_lens, accepted_nodes=walk.accepted_nodes)
    finally:
        B.worker_mod.get_exec = saved_exec
    touched = set()
    ok_commit = True
    for li in range(layers):
        for r in range(batch):
            s = int(slot_of[r])
            node = chosen[r][-1]
            touched.add(s)
            ok_commit &= same_state(gdn, pool.temporal[li, s], node_state[(li, r)][node])
            ok_commit &= bool(torch.equal(pool.conv[0][li, s], pool.inter_conv[0][li, r, node]))
    res["commit_is_accepted_node"] = ok_commit
    track_ok = True
    if case.track:
        for r in range(batch):
            p0, p1, cl = int(pre[r]), int(post[r]), int(commit_lens[r])
            step = max(p1 // interval * interval - p0 - 1, 0)
            ts = int(track[r])
            if p0 // interval != p1 // interval and step < cl:
                res["tracked"] = res.get("tracked", 0) + 1
                touched.add(ts)
                node = chosen[r][step]
                for li in range(layers):
                    track_ok &= same_state(gdn, pool.temporal[li, ts], node_state[(li, r)][node])
    res["track_slot_is_tracked_node"] = track_ok
    others = [s for s in range(slots + 1) if s not in touched]
    res["others_untouched"] = bool(torch.equal(pool.temporal[:, others], before_t[:, others])
                                   and torch.equal(pool.conv[0][:, others], before_c[:, others]))

    # the committed state against the same verify over the accepted path as a plain chain
    seq_ok, seq_err = True, 0.0
    for r in range(batch):
        p = chosen[r]
        m = len(p)
        chain_parent = torch.arange(-1, m - 1, dtype=torch.int32, device=device).view(1, m)
        idx = torch.tensor([r * n1 + j for j in p], device=device)
        for li, layer in enumerate(lay):
            s = int(slot_of[r])
            h0 = temporal0[li].clone()
            cs = conv0[li].clone()
            node_ssm = torch.empty(1, m, hv, vd, kd, device=device)
            node_conv = torch.empty(1, m, dim, shapes["conv_kernel"] - 1, dtype=dtype, device=device)
            sl = torch.tensor([s], dtype=torch.int32, device=device)
            impl = hybrid._impl()
            y, _ = rt.tree_causal_conv1d(x[idx].view(1, m, dim), chain_parent, cs, sl, layer.conv_weights, None,
                                         "silu", node_conv=node_conv, impl=impl)
            q = y[..., : hk * kd].unflatten(-1, (hk, kd))
            k = y[..., hk * kd: 2 * hk * kd].unflatten(-1, (hk, kd))
            v = y[..., 2 * hk * kd:].unflatten(-1, (hv, vd))
            g, beta = hybrid.gdn_gating(layer.A_log, a[idx], bb[idx], layer.dt_bias)
            rt.tree_gated_delta_rule(q, k, v, g.view(1, m, hv), beta.view(1, m, hv), chain_parent, h0, sl,
                                     scale=kd ** -0.5, use_qk_l2norm=True, node_ssm=node_ssm, impl=impl)
            err = float((pool.temporal[li, s] - node_ssm[0, -1]).abs().max())
            seq_err = max(seq_err, err)
            seq_ok &= err <= 1e-5 * float(node_ssm[0, -1].abs().max() + 1) and bool(
                torch.equal(pool.conv[0][li, s], node_conv[0, -1]))
    res["commit_equals_sequential_path"] = seq_ok
    res["sequential_max_abs_diff"] = seq_err
    res["accept_len_max"] = int(walk.accept_len.max())
    res["ok"] = bool(res["ok_verify"] and res["walk_follows_path"] and ok_commit and track_ok
                     and res["others_untouched"] and seq_ok)
    return res


def model_dtype(device: str) -> torch.dtype:
    """bfloat16 (the served dtype) on the GPU. On CPU float32: Triton's interpreter rounds float32 to bfloat16 by
    truncation where the compiled kernel rounds to nearest, so a bfloat16 run there would check the interpreter's
    rounding instead of the kernels."""
    return torch.bfloat16 if device == "cuda" else torch.float32


def run(cases, shapes, device) -> dict:
    B = base()
    results = []
    for case in cases:
        t = time.perf_counter()
        try:
            r = run_case(B, case, shapes, device, dtype=model_dtype(device))
        except Exception as e:  # noqa: BLE001 - reported as a failed case
            import traceback

            r = {"case": case.name, "ok": False, "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc()[-3000:]}
        r["seconds"] = round(time.perf_counter() - t, 2)
        r["spec"] = asdict(case)
        print(("PASS " if r["ok"] else "FAIL ") + json.dumps({k: v for k, v in r.items() if k != "traceback"}),
              flush=True)
        if not r["ok"] and "traceback" in r:
            print(r["traceback"], flush=True)
        results.append(r)
    return {"shapes": shapes, "device": device, "seed": SEED, "cases": results, "dtype": str(model_dtype(device)),
            "gdn_verify": B.hybrid.gdn_verify_mode(),
            "ok": all(r["ok"] for r in results),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None}


def test_hybrid_v2_kernels_gpu():  # pytest entry on a GPU host
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sglang_on_path import skip_reason

    why = skip_reason("0.5.17")  # the 0.5.17 series' patch 0004 with spec-v2/hybrid.py
    if why:
        pytest.skip(why)
    res = run(GPU_CASES, QWEN36, "cuda")
    if os.environ.get("OUT"):  # the same JSON as the script mode's, for python -m bench.e2e.report hybrid-v2 --kernels
        with open(os.path.join(os.environ["OUT"], "hybrid_v2_kernels.json"), "w") as f:
            json.dump(res, f, indent=1)
    assert res["ok"], [c for c in res["cases"] if not c["ok"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="small head counts on CPU (Triton interpreter)")
    ap.add_argument("--out", help="write the results as JSON here (default: $OUT/hybrid_v2_kernels.json if $OUT)")
    ap.add_argument("--cases", help="comma-separated case names to run (default: all)")
    ns = ap.parse_args()
    cases, shapes, device = (CPU_CASES, CPU, "cpu") if ns.cpu_smoke else (GPU_CASES, QWEN36, "cuda")
    if ns.cases:
        keep = set(ns.cases.split(","))
        cases = [c for c in cases if c.name in keep]
    res = run(cases, shapes, device)
    out = ns.out or (os.path.join(os.environ["OUT"], "hybrid_v2_kernels.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    print(("ALL PASS" if res["ok"] else "SOME FAILED") + f" ({len(res['cases'])} cases)")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
