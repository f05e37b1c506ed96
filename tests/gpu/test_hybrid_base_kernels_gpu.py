"""SGLang 0.5.11's own tree-aware recurrent kernels on DDTree trees (patch 0004, issue #9), against float64 paths.

Patch 0004 serves hybrid GatedDeltaNet targets by handing DDTree's tree to the kernels SGLang already has for EAGLE
trees, so what must hold is that *those* kernels are right on DDTree trees (heap pop order, unused slots, budget 1,
chains as deep as the drafter goes) and that the commit picks the accepted node. One round per configuration:

1. trees from the runtime (``draft_topk`` -> ``build_tree`` -> ``build_verify_inputs``; first child / next sibling
   cast to int32 as ``DFlashWorker`` does);
2. the verify of one GDN layer exactly as ``GDNAttnBackend.forward_extend`` runs it in TARGET_VERIFY:
   ``causal_conv1d_update`` (intermediate conv windows, retrieve_next_token/_sibling, writes retrieve_parent_token)
   then ``fused_sigmoid_gating_delta_rule_update`` (disable_state_update, intermediate states, cache_steps,
   retrieve_parent_token), over SGLang's pool layouts and for two layers;
3. the walk (runtime ``accept_walk``) and the commit of ``update_mamba_state_after_mtp_verify``:
   ``fused_mamba_state_scatter_with_mask`` with step index ``ddtree_hybrid.path_steps_to_nodes(commit_lens - 1, ...)``.

Checked per used node: conv outputs and windows, GDN outputs and intermediate states against a float64 recurrence
along the node's own root->node path (and against the runtime's plain-torch references); the derived parents; the
committed conv window / SSM state of every request against the float64 sequential recurrence over its accepted path
and against the same kernels run as a plain chain over that path; SSM pool untouched by the verify; other slots
untouched by the commit. Then a timing of tree verify vs chain verify at equal token count (20 reps, CUDA events).

Pytest tests on the GPU host, one per case (the patched sglang importable, e.g. after ``bench/e2e/gpu_run.sh``
built the overlay):
    PYTHONPATH=/tmp/overlay:/tmp/site python3 -m pytest -m gpu -s tests/gpu/test_hybrid_base_kernels_gpu.py
each case prints its PASS line with its max errors; the summary (cases, errors, timings) goes to
``hybrid_base_kernels.json`` under $OUT when set. ``tests/sglang_v1/test_hybrid_ddtree.py`` imports this file and runs
its checks at interpreter-sized shapes on CPU (its own cases), so CI exercises the very code the H200 runs.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
#: a per-run seed, replayed with DDTREE_TEST_SEED
SEED = int(os.environ.get("DDTREE_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


# ------------------------------------------------------------------------------------------- loading the kernels


def interpreter_numpy_shim() -> None:
    """Let the Triton interpreter index with a loaded scalar under NumPy >= 2.4 (no effect when compiling).

    The GDN verify kernel loops ``for _ in range(0, T)`` with ``T`` loaded from ``cu_seqlens``. The interpreter
    turns that scalar into an int with ``int(array)``, which NumPy 2.4 refuses for a 1-element 1-d array. The
    compiled kernel never goes through this; the shim only keeps the CPU run on the same call as the GPU one.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.runtime.interpreter as interp

    if getattr(interp, "_ddtree_index_shim", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched
    interp._ddtree_index_shim = True


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass
class BaseKernels:
    """The base's kernels and the patch set's pieces, loaded by path from one sglang package directory."""

    conv: ModuleType  # sglang/srt/layers/attention/mamba/causal_conv1d_triton.py
    gdn: ModuleType  # sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py
    scatter: ModuleType  # sglang/srt/layers/attention/mamba/mamba_state_scatter_triton.py
    hybrid: ModuleType  # sglang/srt/speculative/ddtree_hybrid.py (vendored from patches/ddtree/spec-v1, for 0004)
    rt: ModuleType  # the vendored runtime, sglang/srt/speculative/ddtree/


def find_sglang_dir() -> Path | None:
    """The importable sglang package directory, found without importing sglang (it pulls CUDA-only modules); only
    a regular package counts (tests/gpu/sglang_on_path.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sglang_on_path import sglang_dir

    return sglang_dir()


def load_base_kernels(sglang_dir: Path, tag: str = "hbk") -> BaseKernels:
    """Load the three kernel files (torch + triton only), ddtree_hybrid and the runtime from ``sglang_dir``."""
    interpreter_numpy_shim()
    att = sglang_dir / "srt" / "layers" / "attention"
    spec_dir = sglang_dir / "srt" / "speculative"
    sys.path.insert(0, str(ROOT))
    from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime

    rt = load_runtime(spec_dir / "ddtree", module_name=f"{tag}_runtime")
    return BaseKernels(
        conv=_load(f"{tag}_causal_conv1d_triton", att / "mamba" / "causal_conv1d_triton.py"),
        gdn=_load(f"{tag}_fused_sigmoid_gating_recurrent", att / "fla" / "fused_sigmoid_gating_recurrent.py"),
        scatter=_load(f"{tag}_mamba_state_scatter_triton", att / "mamba" / "mamba_state_scatter_triton.py"),
        hybrid=_load(f"{tag}_ddtree_hybrid", spec_dir / "ddtree_hybrid.py"),
        rt=rt,
    )


# ------------------------------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """One verify round: tree shape, batch and a GDN layer's per-head sizes (Qwen3-Next: H=16, HV=32, K=V=128)."""

    budget: int
    batch: int
    kind: str = "normal"  # normal | ties | chain (deepest) | unused (fewer nodes than the budget)
    heads: int = 1  # H (q/k heads)
    hv: int = 2  # value heads, a multiple of H
    kd: int = 16  # K
    vd: int = 16  # V
    k_conv: int = 4
    layers: int = 2
    dtype: str = "float32"  # activations and conv state; the SSM state is always fp32 (SGLang's default)
    bias: bool = False  # Qwen3-Next's conv has no bias
    padded: bool = False  # last request is a CUDA-graph padding row (mamba index -1), not committed

    @property
    def n1(self) -> int:
        return self.budget + 1

    @property
    def conv_dim(self) -> int:
        return 2 * self.heads * self.kd + self.hv * self.vd

    def label(self) -> str:
        return (f"b{self.budget}xB{self.batch}-{self.kind}-H{self.heads}/HV{self.hv}-K{self.kd}-D{self.conv_dim}"
                f"-{self.dtype}{'-bias' if self.bias else ''}{'-pad' if self.padded else ''}")


def draft_tree(rt, gen: torch.Generator, case: Case):
    """A batch of real DDTree trees from the runtime, on CPU. ``chain`` = peaked drafts with depth >= budget (a pure
    chain when budget <= 31), ``ties`` = small-integer logits, ``unused`` = vocab 2 x depth 2 (at most 6 nodes)."""
    depth, vocab = 6, 23
    if case.kind == "chain":
        depth = min(max(case.budget, 1), 31)
    if case.kind == "unused":
        depth, vocab = 2, 2
    if case.kind == "ties":
        logits = torch.randint(-2, 2, (case.batch, depth, vocab), generator=gen).float()
    elif case.kind == "chain":
        logits = torch.randn(case.batch, depth, vocab, generator=gen)
        logits.scatter_(2, torch.randint(0, vocab, (case.batch, depth, 1), generator=gen), 40.0)
    else:
        logits = torch.randn(case.batch, depth, vocab, generator=gen) * 2.0
    lp, tok = rt.draft_topk(logits, min(case.budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (case.batch,), generator=gen)
    return rt.build_tree(lp, tok, roots, case.budget, impl="torch")


def planted_targets(tree, gen: torch.Generator, p_follow: float = 0.85) -> torch.Tensor:
    """Target tokens that follow a random child with probability p_follow at each node (varied accept lengths)."""
    batch, n1 = tree.parent.shape
    target = torch.full((batch, n1), -7, dtype=torch.int64)
    for b in range(batch):
        for i in range(int(tree.num_nodes[b])):
            kids = (tree.parent[b] == i).nonzero().flatten()
            if len(kids) and float(torch.rand((), generator=gen)) < p_follow:
                target[b, i] = tree.token[b, kids[int(torch.randint(0, len(kids), (), generator=gen))]]
    return target


def paths_matrix(parent: torch.Tensor, num_nodes: torch.Tensor):
    """paths [B, N1, Dmax] (root..node, left-aligned, -1 padded) and lengths [B, N1] for used nodes (0 elsewhere)."""
    batch, n1 = parent.shape
    rows = {}
    for b in range(batch):
        pr = parent[b].tolist()
        for i in range(int(num_nodes[b])):
            p = [i]
            while pr[p[-1]] >= 0:
                p.append(pr[p[-1]])
            rows[b, i] = p[::-1]
    dmax = max(len(p) for p in rows.values())
    paths = torch.full((batch, n1, dmax), -1, dtype=torch.long)
    lens = torch.zeros(batch, n1, dtype=torch.long)
    for (b, i), p in rows.items():
        paths[b, i, :len(p)] = torch.tensor(p)
        lens[b, i] = len(p)
    return paths, lens


# ---------------------------------------------------------------------------------------- float64 path oracles


def conv_path_oracle(x, paths, lens, init, weight, bias):
    """Causal depthwise conv (then SiLU) along each node's path, starting from the committed window, in float64.

    x [B, N1, D]; paths/lens from :func:`paths_matrix`; init [B, D, K_conv-1] oldest first. Returns
    (out [B, N1, D], window [B, N1, D, K_conv-1] oldest first): the same quantities SGLang's kernel keeps per node.
    """
    batch, n1, dim = x.shape
    kc = weight.shape[1]
    dev = x.device
    x, init, weight = x.double(), init.double(), weight.double()
    paths, lens = paths.to(dev), lens.to(dev)
    bi = torch.arange(batch, device=dev)[:, None].expand(batch, n1)
    back = []  # back[j]: the input j steps back along the path, [B, N1, D]
    for j in range(kc):
        pos = lens - 1 - j  # index along the path; < 0 reaches into the committed window
        node = torch.gather(paths, 2, pos.clamp(min=0)[..., None]).squeeze(-1).clamp(min=0)
        from_x = x[bi, node]
        col = (kc - 1 + pos).clamp(min=0, max=kc - 2)  # pos = -1 -> newest committed column
        from_init = init.transpose(1, 2)[bi, col]
        back.append(torch.where((pos >= 0)[..., None], from_x, from_init))
    acc = sum(back[j] * weight[:, kc - 1 - j] for j in range(kc))
    if bias is not None:
        acc = acc + bias.double()
    out = acc * torch.sigmoid(acc)
    window = torch.stack([back[kc - 2 - c] for c in range(kc - 1)], dim=-1)
    return out, window


def gdn_path_oracle(q, k, v, g, beta, paths, lens, h0, scale):
    """The GatedDeltaNet recurrence (q/k L2-normalised in the kernel, as SGLang's verify calls it) along each
    node's path from its request's committed state h0 [B, HV, V, K], all nodes at once, one step per depth, float64.
    q, k [B, N1, H, K]; v [B, N1, HV, V]; g (log decay), beta [B, N1, HV]. Returns (o [B,N1,HV,V], h [B,N1,HV,V,K])."""
    dev = q.device
    batch, n1, heads, kd = q.shape
    hv, vd = v.shape[2:]
    rep = hv // heads
    paths, lens = paths.to(dev), lens.to(dev)
    q, k = (t.double().repeat_interleave(rep, 2) for t in (q, k))
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    v, g, beta = v.double(), g.double(), beta.double()
    h = h0.double()[:, None].expand(batch, n1, hv, vd, kd).clone()
    o = torch.zeros(batch, n1, hv, vd, dtype=torch.float64, device=dev)
    bi = torch.arange(batch, device=dev)[:, None].expand(batch, n1)
    for t in range(paths.shape[2]):
        act = t < lens
        j = paths[:, :, t].clamp(min=0)
        kk, qq, vv, gg, bb = k[bi, j], q[bi, j], v[bi, j], g[bi, j], beta[bi, j]
        hn = h * torch.exp(gg)[..., None, None]
        vn = bb[..., None] * (vv - (hn * kk[..., None, :]).sum(-1))
        hn = hn + vn[..., None] * kk[..., None, :]
        h = torch.where(act[..., None, None, None], hn, h)
        last = t == lens - 1
        o = torch.where(last[..., None, None], (hn * (qq * scale)[..., None, :]).sum(-1), o)
    return o, h


# --------------------------------------------------------------- the base kernels, called as SGLang calls them

POOL_SLOTS, SPEC_SLOTS = 40, 20  # request slots of the state pools, lines of the intermediate buffers (>= batch)


@dataclass
class Pools:
    """SGLang's MambaPool.SpeculativeState for the GDN layers: [layers, slots+1, ...] and [layers, spec+1, N1, ...]."""

    conv: torch.Tensor  # [L, slots+1, D, K_conv-1]
    ssm: torch.Tensor  # [L, slots+1, HV, V, K] fp32
    inter_conv: torch.Tensor  # [L, spec+1, N1, D, K_conv-1]
    inter_ssm: torch.Tensor  # [L, spec+1, N1, HV, V, K]

    def clone(self) -> Pools:
        return Pools(*(t.clone() for t in (self.conv, self.ssm, self.inter_conv, self.inter_ssm)))


def verify_layer(kern: BaseKernels, layer: int, lw: SimpleNamespace, mixed_qkv, a, b, pools: Pools,
                 cache_indices, inter_indices, batch: int, n1: int, tree_arrays, graph_buffers: bool = False):
    """One GDN layer's TARGET_VERIFY as ``GDNAttnBackend.forward_extend`` runs it (0.5.11, triton kernels).

    ``tree_arrays`` = (retrieve_next_token, retrieve_next_sibling) int32 [B, N1] for tree verify, None for the
    chain. retrieve_parent_token is allocated as ``MambaAttnBackendBase`` does: ``empty_like`` in eager mode, a
    zero-initialised persistent buffer under CUDA graphs (``graph_buffers``; the only mode with padding rows, whose
    row the conv kernel skips and the GDN kernel still reads). Returns (core_attn_out [1, B*N1, HV, V],
    conv output [B*N1, D], retrieve_parent_token or None).
    """
    seq_len = mixed_qkv.shape[0]
    rnt = rns = rpt = None
    if tree_arrays is not None:
        rnt, rns = tree_arrays
        rpt = torch.zeros_like(rnt) if graph_buffers else torch.empty_like(rnt)
    query_start_loc = torch.arange(0, seq_len + 1, step=n1, dtype=torch.int32, device=mixed_qkv.device)
    x = mixed_qkv.view(batch, n1, -1).transpose(1, 2)
    conv_out = kern.conv.causal_conv1d_update(
        x, pools.conv[layer], lw.conv_weights, lw.bias, lw.activation,
        conv_state_indices=cache_indices[:batch],
        intermediate_conv_window=pools.inter_conv[layer],
        intermediate_state_indices=inter_indices[:batch],
        retrieve_next_token=rnt, retrieve_next_sibling=rns, retrieve_parent_token=rpt,
    )
    mixed = conv_out.transpose(1, 2).reshape(seq_len, -1)
    q, k, v = torch.split(mixed, [lw.q_dim, lw.k_dim, lw.v_dim], dim=-1)
    q = q.reshape(1, seq_len, lw.heads, lw.kd)
    k = k.reshape(1, seq_len, lw.heads, lw.kd)
    v = v.reshape(1, seq_len, lw.hv, lw.vd)
    core = kern.gdn.fused_sigmoid_gating_delta_rule_update(  # TritonGDNKernel.target_verify
        A_log=lw.A_log, dt_bias=lw.dt_bias, q=q, k=k, v=v, a=a, b=b,
        initial_state_source=pools.ssm[layer], initial_state_indices=cache_indices,
        cu_seqlens=query_start_loc, use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0,
        is_kda=False, disable_state_update=True, intermediate_states_buffer=pools.inter_ssm[layer],
        intermediate_state_indices=inter_indices, cache_steps=n1, retrieve_parent_token=rpt,
    )
    return core, mixed, rpt


def scatter_with_mask(kern: BaseKernels, dst, src, dst_indices, step_indices) -> None:
    """``fused_mamba_state_scatter_with_mask`` on CUDA. Its wrapper refuses non-CUDA tensors, so on CPU (the
    interpreter) the same kernel is launched with the wrapper's grid and arguments."""
    if dst.is_cuda:
        kern.scatter.fused_mamba_state_scatter_with_mask(dst, src, dst_indices, step_indices)
        return
    total = step_indices.shape[0]
    elem = dst.numel() // (dst.shape[0] * dst.shape[1])
    block = 1024
    grid = (total, dst.shape[0], (elem + block - 1) // block)
    kern.scatter._fused_mamba_state_scatter_with_mask_kernel[grid](
        src, dst, dst_indices.to(torch.int32).contiguous(), step_indices.to(torch.int32).contiguous(), total, elem,
        src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1),
        src.shape[1], src.shape[2], dst.shape[1], BLOCK_SIZE=block)


def commit(kern: BaseKernels, pools: Pools, cache_indices, steps) -> None:
    """``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`` (the two scatters, all layers at once)."""
    scatter_with_mask(kern, pools.ssm, pools.inter_ssm, cache_indices, steps)
    scatter_with_mask(kern, pools.conv, pools.inter_conv, cache_indices, steps)


# -------------------------------------------------------------------------------------------------- one round


def _dt(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def make_layer(case: Case, gen: torch.Generator, dev) -> SimpleNamespace:
    dt = _dt(case.dtype)
    d = case.conv_dim
    return SimpleNamespace(
        conv_weights=(torch.randn(d, case.k_conv, generator=gen) * 0.5).to(dt).to(dev),
        bias=(torch.randn(d, generator=gen) * 0.1).to(dt).to(dev) if case.bias else None,
        activation="silu",
        A_log=(torch.randn(case.hv, generator=gen) * 0.5).to(dev),
        dt_bias=torch.randn(case.hv, generator=gen).to(dev),
        heads=case.heads, hv=case.hv, kd=case.kd, vd=case.vd,
        q_dim=case.heads * case.kd, k_dim=case.heads * case.kd, v_dim=case.hv * case.vd,
    )


def _tol(case: Case) -> dict:
    """fp32 activations: float rounding only; bf16: the kernels round conv products and outputs to bf16."""
    return dict(rtol=1e-4, atol=1e-4) if case.dtype == "float32" else dict(rtol=2e-2, atol=2e-2)


def _close(name: str, got, want, tol: dict, report: dict) -> None:
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    report[name] = max(report.get(name, 0.0), err)
    torch.testing.assert_close(got.double(), want.double(), **tol, msg=lambda m: f"{name}: {m}")


def run_round(kern: BaseKernels, case: Case, seed: int, dev) -> dict:
    """Build, verify (tree), walk, commit; check everything against the oracles. Returns the max errors."""
    gen = torch.Generator().manual_seed(seed)
    rt, dt = kern.rt, _dt(case.dtype)
    batch, n1, d, kc, L = case.batch, case.n1, case.conv_dim, case.k_conv, case.layers
    tree = draft_tree(rt, gen, case)
    rt.check_parent_order(tree.parent)
    vin = rt.build_verify_inputs(tree, torch.full((batch,), 100, dtype=torch.int64), impl="torch")
    arrays = (vin.retrive_next_token.to(torch.int32).to(dev), vin.retrive_next_sibling.to(torch.int32).to(dev))
    nn = tree.num_nodes.long()
    paths, lens = paths_matrix(tree.parent, nn)

    # fixed pool sizes: the conv kernel takes the pool's line count as a constexpr, so a size per case would
    # recompile it per case (its tree branch at N1 = 65 alone takes ~25 s to compile)
    slots, spec = POOL_SLOTS, SPEC_SLOTS
    cache_indices = (torch.randperm(slots, generator=gen)[:batch] + 1).to(torch.int32)
    if case.padded:
        cache_indices[-1] = -1
    cache_indices = cache_indices.to(dev)
    inter_indices = torch.arange(spec + 1, dtype=torch.int32, device=dev)  # GDNAttnBackend: arange(pool size)
    pools = Pools(
        conv=torch.randn(L, slots + 1, d, kc - 1, generator=gen).to(dt).to(dev),
        ssm=(torch.randn(L, slots + 1, case.hv, case.vd, case.kd, generator=gen) * 0.3).to(dev),
        inter_conv=torch.full((L, spec + 1, n1, d, kc - 1), float("nan")).to(dt).to(dev),
        inter_ssm=torch.full((L, spec + 1, n1, case.hv, case.vd, case.kd), float("nan")).to(dev),
    )
    before = pools.clone()
    layers = [make_layer(case, gen, dev) for _ in range(L)]
    inputs = [(torch.randn(batch * n1, d, generator=gen).to(dt).to(dev),
               torch.randn(batch * n1, case.hv, generator=gen).to(dt).to(dev),
               torch.randn(batch * n1, case.hv, generator=gen).to(dt).to(dev)) for _ in range(L)]
    real = [r for r in range(batch) if not (case.padded and r == batch - 1)]
    tol, report = _tol(case), {}
    sc = case.kd ** -0.5
    cs = cache_indices.long().clamp(min=0)
    conv_in, gdn_in = [], []

    for layer, (lw, (mixed_qkv, a, b)) in enumerate(zip(layers, inputs, strict=True)):
        core, mixed, rpt = verify_layer(kern, layer, lw, mixed_qkv, a, b, pools, cache_indices, inter_indices,
                                        batch, n1, arrays, graph_buffers=case.padded)
        x = mixed_qkv.view(batch, n1, d)
        init = before.conv[layer][cs]
        out_ref, win_ref = conv_path_oracle(x, paths, lens, init, lw.conv_weights, lw.bias)
        qkv = mixed.view(batch, n1, d)
        q = qkv[..., :lw.q_dim].reshape(batch, n1, lw.heads, lw.kd)
        k = qkv[..., lw.q_dim:lw.q_dim + lw.k_dim].reshape(batch, n1, lw.heads, lw.kd)
        v = qkv[..., lw.q_dim + lw.k_dim:].reshape(batch, n1, lw.hv, lw.vd)
        g = (-torch.exp(lw.A_log.double()) * torch.nn.functional.softplus(a.double() + lw.dt_bias.double()))
        beta = torch.sigmoid(b.double())
        g, beta = g.view(batch, n1, lw.hv), beta.view(batch, n1, lw.hv)
        h0 = before.ssm[layer][cs]
        o_ref, st_ref = gdn_path_oracle(q, k, v, g, beta, paths, lens, h0, sc)
        # the runtime's plain-torch references on the same inputs (parents from the tree, not the kernel)
        y_rt, w_rt = kern.rt.tree_recurrent.tree_causal_conv1d_torch(
            x, tree.parent.to(dev), before.conv[layer], cache_indices.long(), lw.conv_weights, lw.bias, "silu")
        o_rt, st_rt = kern.rt.tree_recurrent.tree_gated_delta_rule_torch(
            q, k, v, g.float(), beta.float(), tree.parent.to(dev), before.ssm[layer], cache_indices.long(),
            scale=sc, use_qk_l2norm=True)
        core = core.view(batch, n1, lw.hv, lw.vd)
        for r in real:
            n = int(nn[r])
            pr = tree.parent[r, 1:n].to(torch.int32)
            assert torch.equal(rpt[r, 1:n].cpu(), pr), f"retrieve_parent_token row {r}: {rpt[r, :n]} vs {pr}"
            _close("conv_out", qkv[r, :n], out_ref[r, :n], tol, report)
            assert torch.equal(pools.inter_conv[layer, r, :n].double(), win_ref[r, :n].to(dt).double()), \
                f"conv windows of request {r} differ from the path inputs"
            _close("conv_out_vs_runtime", qkv[r, :n], y_rt[r, :n], tol, report)
            assert torch.equal(pools.inter_conv[layer, r, :n], w_rt[r, :n].to(dt)), "windows vs runtime reference"
            _close("gdn_state", pools.inter_ssm[layer, r, :n], st_ref[r, :n], tol, report)
            _close("gdn_out", core[r, :n], o_ref[r, :n], tol, report)
            _close("gdn_state_vs_runtime", pools.inter_ssm[layer, r, :n], st_rt[r, :n], tol, report)
        conv_in.append((x, init, lw))
        gdn_in.append((q, k, v, g, beta, h0))

    # the verify must leave the SSM pool alone (disable_state_update); the conv pool of the batch's slots is
    # overwritten by the kernel's window roll (only the commit makes it right), every other slot is untouched
    assert torch.equal(pools.ssm, before.ssm), "tree verify modified the SSM pool"
    other = torch.ones(slots + 1, dtype=torch.bool)
    other[cs[real].cpu()] = False
    assert torch.equal(pools.conv[:, other.to(dev)], before.conv[:, other.to(dev)]), "verify touched other conv slots"

    # walk + commit through path_steps_to_nodes, exactly as DFlashWorker._update_target_mamba_state_after_verify
    target = planted_targets(tree, gen)
    walk = rt.accept_walk(tree, target, impl="torch")
    commit_lens = (walk.accept_len.long() + 1).to(dev)
    steps = kern.hybrid.path_steps_to_nodes(commit_lens.to(torch.int64) - 1, walk.accepted_nodes.to(dev))
    nr = len(real)  # padded rows are beyond request_number: never committed
    commit(kern, pools, cache_indices[:nr], steps[:nr])

    report["accept_len"] = walk.accept_len.tolist()
    for r in real:
        node = int(steps[r])
        path = walk.accepted_nodes[r, :int(walk.accept_len[r]) + 1].tolist()
        assert node == path[-1] and paths[r, node, :int(lens[r, node])].tolist() == path, "step -> node mapping"
        s = int(cs[r])
        for layer in range(L):
            # the committed state is exactly the intermediate state of the accepted node (a copy) ...
            assert torch.equal(pools.ssm[layer, s], pools.inter_ssm[layer, r, node]), "committed SSM state"
            assert torch.equal(pools.conv[layer, s], pools.inter_conv[layer, r, node]), "committed conv window"
            # ... and equals the float64 sequential recurrence over the accepted path alone
            x, init, lw = conv_in[layer]
            q, k, v, g, beta, h0 = gdn_in[layer]
            m, pp = len(path), torch.tensor(path, device=dev)
            cpaths, clens = paths_matrix(torch.tensor([[-1] + list(range(m - 1))]), torch.tensor([m]))
            _, wseq = conv_path_oracle(x[r:r + 1, pp], cpaths, clens, init[r:r + 1], lw.conv_weights, lw.bias)
            assert torch.equal(pools.conv[layer, s].double(), wseq[0, m - 1].to(dt).double()), "conv vs sequence"
            _, hseq = gdn_path_oracle(q[r:r + 1, pp], k[r:r + 1, pp], v[r:r + 1, pp], g[r:r + 1, pp],
                                      beta[r:r + 1, pp], cpaths, clens, h0[r:r + 1], sc)
            _close("committed_ssm_vs_sequence", pools.ssm[layer, s], hseq[0, m - 1], tol, report)
    untouched = torch.ones(slots + 1, dtype=torch.bool)
    untouched[cs[real].cpu()] = False
    u = untouched.to(dev)
    assert torch.equal(pools.ssm[:, u], before.ssm[:, u]), "commit touched another SSM slot"
    assert torch.equal(pools.conv[:, u], before.conv[:, u]), "commit touched another conv slot"

    # the same kernels run as a plain chain over each accepted path must reach the committed state
    report["chain_replay_max_err"] = chain_replay(kern, case, layers, inputs, before, walk, cache_indices, real,
                                                  pools, dev)
    return report


def chain_replay(kern, case: Case, layers, inputs, before: Pools, walk, cache_indices, real, committed: Pools,
                 dev) -> float:
    """Chain verify (no retrieve arrays) of every accepted path, padded with its last node; the state at the path's
    end must equal what the tree verify committed (fp32 SSM state: to rounding; windows: exactly)."""
    batch, d, kc = case.batch, case.conv_dim, case.k_conv
    al = walk.accept_len.long()
    width = 1 << int(al.max()).bit_length()  # >= longest path; a power of two so few widths are compiled
    rows = torch.zeros(batch, width, dtype=torch.long)
    for r in range(batch):
        p = walk.accepted_nodes[r, :int(al[r]) + 1].long()
        rows[r, :len(p)] = p
        rows[r, len(p):] = p[-1]
    flat = (torch.arange(batch)[:, None] * case.n1 + rows).flatten().to(dev)
    pools = before.clone()
    lines = SPEC_SLOTS + 1
    pools.inter_conv = torch.full((case.layers, lines, width, d, kc - 1), float("nan")).to(pools.conv.dtype).to(dev)
    pools.inter_ssm = torch.full((case.layers, lines, width, case.hv, case.vd, case.kd), float("nan")).to(dev)
    inter_indices = torch.arange(lines, dtype=torch.int32, device=dev)
    worst = 0.0
    cs = cache_indices.long()
    for layer, (lw, (mixed_qkv, a, b)) in enumerate(zip(layers, inputs, strict=True)):
        verify_layer(kern, layer, lw, mixed_qkv[flat].contiguous(), a[flat].contiguous(), b[flat].contiguous(),
                     pools, cache_indices, inter_indices, batch, width, None)
        for r in real:
            end = int(al[r])
            got_w, want_w = pools.inter_conv[layer, r, end], committed.conv[layer, cs[r]]
            assert torch.equal(got_w, want_w), f"chain replay window differs (layer {layer}, request {r})"
            got, want = pools.inter_ssm[layer, r, end], committed.ssm[layer, cs[r]]
            worst = max(worst, (got - want).abs().max().item())
            # fp32: identical arithmetic up to the conv's summation order; bf16: that order can move a conv
            # output by one bf16 ulp, which the recurrence carries
            torch.testing.assert_close(got, want, **_tol(case))
    return worst


# ---------------------------------------------------------------------------------------------------- timing


def time_tree_vs_chain(kern: BaseKernels, case: Case, seed: int, reps: int = 20, dev=None) -> dict:
    """Tree verify vs chain verify of one GDN layer (conv + GDN kernels) at equal token count B x N1, CUDA events
    (on CPU, for the dry run, a wall clock: the numbers mean nothing there)."""
    dev = torch.device(dev or "cuda")
    cuda = dev.type == "cuda"
    gen = torch.Generator().manual_seed(seed)
    dt = _dt(case.dtype)
    batch, n1, d, kc = case.batch, case.n1, case.conv_dim, case.k_conv
    tree = draft_tree(kern.rt, gen, case)
    vin = kern.rt.build_verify_inputs(tree, torch.zeros(batch, dtype=torch.int64), impl="torch")
    arrays = (vin.retrive_next_token.to(torch.int32).to(dev), vin.retrive_next_sibling.to(torch.int32).to(dev))
    pools = Pools(conv=torch.randn(1, POOL_SLOTS + 1, d, kc - 1, generator=gen).to(dt).to(dev),
                  ssm=torch.randn(1, POOL_SLOTS + 1, case.hv, case.vd, case.kd, generator=gen).to(dev) * 0.3,
                  inter_conv=torch.zeros(1, SPEC_SLOTS + 1, n1, d, kc - 1, dtype=dt, device=dev),
                  inter_ssm=torch.zeros(1, SPEC_SLOTS + 1, n1, case.hv, case.vd, case.kd, device=dev))
    cache_indices = torch.arange(1, batch + 1, dtype=torch.int32, device=dev)
    inter_indices = torch.arange(SPEC_SLOTS + 1, dtype=torch.int32, device=dev)
    lw = make_layer(case, gen, dev)
    mixed = torch.randn(batch * n1, d, generator=gen).to(dt).to(dev)
    a = torch.randn(batch * n1, case.hv, generator=gen).to(dt).to(dev)
    b = torch.randn(batch * n1, case.hv, generator=gen).to(dt).to(dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {}
    for name, arr in (("tree", arrays), ("chain", None)):
        t0 = time.time()
        verify_layer(kern, 0, lw, mixed, a, b, pools, cache_indices, inter_indices, batch, n1, arr)
        sync()
        out[f"{name}_first_call_s"] = round(time.time() - t0, 2)  # includes the Triton compile
        for _ in range(3 if cuda else 0):
            verify_layer(kern, 0, lw, mixed, a, b, pools, cache_indices, inter_indices, batch, n1, arr)
        ms = []
        for _ in range(reps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t1 = time.perf_counter()
            verify_layer(kern, 0, lw, mixed, a, b, pools, cache_indices, inter_indices, batch, n1, arr)
            if cuda:
                end.record()
                ms.append((start, end))
            else:
                ms.append((time.perf_counter() - t1) * 1e3)
        sync()
        ms = sorted(x if isinstance(x, float) else x[0].elapsed_time(x[1]) for x in ms)
        out[f"{name}_ms_median"] = round(ms[len(ms) // 2], 4)
        out[f"{name}_ms_min"] = round(ms[0], 4)
    out["tree_over_chain"] = round(out["tree_ms_median"] / out["chain_ms_median"], 3)
    return out


# ------------------------------------------------------------------------------------------------------ cases


def gpu_cases() -> list[Case]:
    """Qwen3-Next-like heads (K=V=128, H=HV/2; conv dim 256*HV: 1k/2k/8k), budgets 1/4/15/64, batch 1/4/16,
    every tree kind, fp32 (exact comparison) and bf16 activations (Qwen3-Next's serving dtype)."""
    hv_of = {(1, 1): 4, (1, 4): 8, (1, 16): 32, (4, 1): 8, (4, 4): 32, (4, 16): 4,
             (15, 1): 32, (15, 4): 4, (15, 16): 8, (64, 1): 8, (64, 4): 32, (64, 16): 32}
    kinds = ("normal", "ties", "chain", "unused")
    cases = []
    for i, ((budget, batch), hv) in enumerate(hv_of.items()):
        cases.append(Case(budget=budget, batch=batch, kind=kinds[i % 4] if budget > 1 else "normal",
                          heads=hv // 2, hv=hv, kd=128, vd=128, padded=batch == 4))
    cases += [Case(budget=64, batch=16, kind="chain", heads=16, hv=32, kd=128, vd=128),
              Case(budget=15, batch=4, kind="normal", heads=4, hv=8, kd=128, vd=128, dtype="bfloat16", bias=True),
              Case(budget=64, batch=4, kind="ties", heads=16, hv=32, kd=128, vd=128, dtype="bfloat16")]
    return cases


def timing_cases() -> list[Case]:
    return [Case(budget=bu, batch=ba, heads=16, hv=32, kd=128, vd=128, dtype="bfloat16", layers=1)
            for bu in (15, 64) for ba in (1, 4, 16)]


# ------------------------------------------------------------------------------------------------------- tests
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def summary():
    """What the run found, case by case; written to $OUT/hybrid_base_kernels.json (when set) after the last test."""
    doc: dict = {"seed": SEED, "device": None, "sglang": None, "cases": [], "timing": []}
    yield doc
    doc["failed"] = sum(not c["ok"] for c in doc["cases"])
    out = os.environ.get("OUT")
    if out and doc["device"]:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "hybrid_base_kernels.json").write_text(json.dumps(doc, indent=1))


@pytest.fixture(scope="module")
def gpu_kern(summary) -> BaseKernels:
    sg = find_sglang_dir()  # (puts tests/gpu on sys.path for sglang_on_path)
    from sglang_on_path import skip_reason

    why = skip_reason("0.5.11")  # the 0.5.11 overlay: sglang/srt/speculative/ddtree_hybrid.py
    if why:
        pytest.skip(why)
    summary.update(device=torch.cuda.get_device_name(), sglang=str(sg))
    print(f"DDTREE_TEST_SEED={SEED} device={summary['device']} sglang={sg}", flush=True)
    return load_base_kernels(sg)


@pytest.mark.parametrize("i,case", list(enumerate(gpu_cases())), ids=[c.label() for c in gpu_cases()])
def test_base_kernels_on_ddtree_trees_gpu(gpu_kern, summary, i: int, case: Case):
    t0 = time.time()
    entry = {"case": case.label(), **asdict(case)}
    summary["cases"].append(entry)
    try:
        rep = run_round(gpu_kern, case, SEED * 7919 + i, torch.device("cuda"))
    except Exception as e:
        entry.update(ok=False, error=f"{type(e).__name__}: {str(e)[:3000]}")
        raise
    finally:
        torch.cuda.empty_cache()
    entry.update(ok=True, errors=rep, wall_s=round(time.time() - t0, 2))
    errs = {k: v for k, v in rep.items() if isinstance(v, float)}
    print(f"PASS {case.label()} ({entry['wall_s']}s) max errors " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()))


@pytest.mark.parametrize("i,case", list(enumerate(timing_cases())), ids=[c.label() for c in timing_cases()])
def test_tree_vs_chain_timing_gpu(gpu_kern, summary, i: int, case: Case):
    """Recorded, not judged (speed is the bench's business): both verifies run and give a time."""
    t = time_tree_vs_chain(gpu_kern, case, SEED + i, reps=20, dev="cuda")
    summary["timing"].append({"case": case.label(), **t})
    assert t["tree_ms_median"] > 0 and t["chain_ms_median"] > 0
    print(f"TIME {case.label()}: tree {t['tree_ms_median']:.4f} ms, chain {t['chain_ms_median']:.4f} ms "
          f"(x{t['tree_over_chain']}); first call tree {t['tree_first_call_s']}s chain {t['chain_first_call_s']}s")

