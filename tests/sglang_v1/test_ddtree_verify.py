"""The patch set's DDTree glue (sglang/srt/speculative/ddtree_verify.py) with the vendored runtime, on CPU.

Everything here is real computation on real tensors: trees come from the runtime's build_tree, walks from its
accept_walk, and results are checked against brute-force definitions.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


def _random_tree(rt, g, bs, depth, vocab, budget):
    logits = torch.randn(bs, depth, vocab, generator=g) * 3
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (bs,), generator=g)
    return rt.build_tree(lp, tok, roots, budget, impl="torch")


def _brute_mask(tree_mask, prefix):
    rows = []
    for b, p in enumerate(prefix.tolist()):
        n1 = tree_mask.shape[1]
        rows.append(torch.cat([torch.ones(n1, p, dtype=torch.bool), tree_mask[b]], 1).flatten())
    return torch.cat(rows)


@pytest.mark.parametrize("bs,budget,depth", [(1, 1, 3), (3, 15, 3), (4, 64, 7), (2, 200, 15)])
def test_expand_tree_mask_matches_brute_force(ddtree_verify, runtime, bs, budget, depth):
    g = torch.Generator().manual_seed(budget * 31 + bs)
    tree = _random_tree(runtime, g, bs, depth, 97, budget)
    prefix = torch.randint(0, 300, (bs,), generator=g)
    vin = runtime.build_verify_inputs(tree, prefix, impl="torch")
    got = ddtree_verify.expand_tree_mask_torch(vin.mask, prefix, int(prefix.sum()))
    assert torch.equal(got, _brute_mask(vin.mask, prefix))
    # the tree block of every row is exactly "self or ancestor", from the parent links
    parent = tree.parent
    for b in range(bs):
        for i in range(budget + 1):
            anc = {i}
            j = int(parent[b, i])
            while j >= 0:
                anc.add(j)
                j = int(parent[b, j])
            row = vin.mask[b, i]
            if i < int(tree.num_nodes[b]):
                assert {k for k in range(budget + 1) if row[k]} == anc


def test_expand_tree_mask_triton_kernel_matches_torch(patched_tree: Path):
    """The Triton mask kernel (0003) under the CPU interpreter: same bytes as the torch expansion."""
    code = textwrap.dedent(f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("dv", {str(patched_tree / 'sglang/srt/speculative/ddtree_verify.py')!r})
        dv = importlib.util.module_from_spec(spec); spec.loader.exec_module(dv)
        g = torch.Generator().manual_seed(7)
        for bs, n1 in [(1, 2), (3, 16), (5, 65), (2, 300)]:
            tm = torch.rand(bs, n1, n1, generator=g) < 0.5
            pre = torch.randint(0, 700, (bs,), generator=g)
            a = dv.expand_tree_mask_torch(tm, pre, int(pre.sum()))
            b = dv.expand_tree_mask_triton(tm, pre, int(pre.sum()), int(pre.max()))
            assert torch.equal(a, b), (bs, n1)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


class _Shard:
    """The attribute names of VocabParallelEmbedding.shard_indices (plain data)."""

    def __init__(self, org_start, num_org, num_org_padded, added_start=0, num_added=0):
        self.org_vocab_start_index = org_start
        self.num_org_elements = num_org
        self.num_org_elements_padded = num_org_padded
        self.added_vocab_start_index = added_start
        self.num_added_elements = num_added


def test_draft_topk_single_rank_equals_full_log_softmax(ddtree_verify):
    g = torch.Generator().manual_seed(3)
    V, H, n, k = 300, 24, 37, 16
    w = torch.randn(V + 4, H, generator=g)  # 4 padding rows that must never be chosen
    w[V:] = 100.0
    head = SimpleNamespace(weight=w, shard_indices=_Shard(0, V, V + 4))
    hs = torch.randn(n, H, generator=g)
    lp, tok = ddtree_verify.ddtree_draft_topk(hs, head, k, chunk_size=8)
    ref = torch.log_softmax(hs @ w[:V].T, -1)
    rv, ri = ref.topk(k, dim=-1)
    assert torch.allclose(lp, rv, atol=1e-5)
    assert torch.equal(tok, ri)
    assert (tok < V).all()


def test_draft_topk_with_added_vocab_maps_ids(ddtree_verify):
    g = torch.Generator().manual_seed(4)
    V, A, H = 40, 3, 8
    w = torch.randn(48 + A, H, generator=g)
    head = SimpleNamespace(weight=w, shard_indices=_Shard(0, V, 48, added_start=V, num_added=A))
    hs = torch.randn(5, H, generator=g)
    lp, tok = ddtree_verify.ddtree_draft_topk(hs, head, 10)
    full = torch.cat([hs @ w[:V].T, hs @ w[48:48 + A].T], -1)  # global ids 0..V-1 then V..V+A-1
    rv, ri = torch.log_softmax(full, -1).topk(10, dim=-1)
    assert torch.allclose(lp, rv, atol=1e-5) and torch.equal(tok, ri)


def _tp_worker(rank, world, port, hs, w, k, q, verify_path, runtime_dir):
    import importlib.util

    import torch.distributed as dist

    spec = importlib.util.spec_from_file_location("rt_tp", f"{runtime_dir}/__init__.py",
                                                  submodule_search_locations=[runtime_dir])
    rt = importlib.util.module_from_spec(spec)
    sys.modules["rt_tp"] = rt
    spec.loader.exec_module(rt)
    spec = importlib.util.spec_from_file_location("dv_tp", verify_path)
    dv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dv)
    dv._RUNTIME = rt

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    class Group:  # the two members of sglang's GroupCoordinator that the draft top-k uses, over real gloo
        world_size = world

        @staticmethod
        def all_gather_into_tensor(out, inp):
            parts = list(out.view(world, -1).unbind(0))
            dist.all_gather(parts, inp.contiguous())
            out.copy_(torch.stack(parts).view(-1))

    V = w.shape[0]
    per = V // world
    shard = _Shard(rank * per, per, per)
    head = SimpleNamespace(weight=w[rank * per:(rank + 1) * per], shard_indices=shard)
    lp, tok = dv.ddtree_draft_topk(hs, head, k, tp_group=Group(), chunk_size=16)
    if rank == 0:  # plain lists: a tensor would be shared through a descriptor that dies with this process
        q.put((lp.tolist(), tok.tolist()))
    dist.destroy_process_group()


def test_draft_topk_tensor_parallel_gathers_only_candidates(patched_tree: Path):
    """Two real gloo ranks, each owning half the vocab: the result equals the single-rank full-vocab top-k."""
    import socket

    import torch.multiprocessing as mp

    g = torch.Generator().manual_seed(5)
    V, H, n, k = 128, 16, 21, 12
    w = torch.randn(V, H, generator=g)
    hs = torch.randn(n, H, generator=g)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")  # fork after torch/OpenMP threads started can deadlock
    q = ctx.Queue()
    vpath = str(patched_tree / "sglang/srt/speculative/ddtree_verify.py")
    rdir = str(patched_tree / "sglang/srt/speculative/ddtree")
    procs = [ctx.Process(target=_tp_worker, args=(r, 2, port, hs, w, k, q, vpath, rdir)) for r in range(2)]
    for p in procs:
        p.start()
    lp, tok = (torch.tensor(x) for x in q.get(timeout=120))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    rv, ri = torch.log_softmax(hs @ w.T, -1).topk(k, dim=-1)
    assert torch.allclose(lp, rv, atol=1e-5)
    assert torch.equal(tok, ri)


def test_accepted_path_kv_and_hidden_index(ddtree_verify, runtime):
    """Walk a real tree with target tokens that follow a chosen path; keep exactly that path's slots."""
    g = torch.Generator().manual_seed(11)
    bs, depth, V, budget = 3, 5, 30, 20
    tree = _random_tree(runtime, g, bs, depth, V, budget)
    n1 = budget + 1
    target = torch.randint(0, V, (bs, n1), generator=g)
    # request 0 follows first children for as long as they exist; request 1 accepts nothing
    node = 0
    want_path = [0]
    while int(tree.first_child[0, node]) >= 0:
        child = int(tree.first_child[0, node])
        target[0, node] = tree.token[0, child]
        node = child
        want_path.append(node)
    tok_set1 = {int(tree.token[1, j]) for j in range(n1) if int(tree.parent[1, j]) == 0}
    target[1, 0] = next(t for t in range(V) if t not in tok_set1)
    walk = runtime.accept_walk(tree, target, impl="torch")
    assert walk.accepted_nodes[0, : len(want_path)].tolist() == want_path
    assert int(walk.accept_len[1]) == 0
    commit = (walk.accept_len + 1).to(torch.int32)
    commit[2] = 1  # a stop token at the first committed token: only the root's KV is kept
    keep_flat, keep_mask, path_mask = ddtree_verify.accepted_kv_and_hidden_index(walk.accepted_nodes, commit, n1)
    expect = [b * n1 + int(walk.accepted_nodes[b, i]) for b in range(bs) for i in range(int(commit[b]))]
    assert keep_flat.tolist() == expect
    assert keep_mask.sum(1).tolist() == commit.tolist()
    # freed = everything else; out_cache_loc re-indexed to the accepted slots, hidden states likewise
    slots = torch.arange(1000, 1000 + bs * n1).view(bs, n1)
    kept = slots.view(-1)[keep_flat]
    freed = slots[~keep_mask]
    assert sorted(kept.tolist() + freed.tolist()) == slots.view(-1).tolist()
    assert kept[: len(want_path)].tolist() == [1000 + j for j in want_path]
    hidden = torch.randn(bs * n1, 4, generator=g)
    ctx = hidden.index_select(0, keep_flat)
    assert torch.equal(ctx[1], hidden[want_path[1]]) if len(want_path) > 1 else True


def test_sample_target_tokens_per_node_greedy_is_argmax(ddtree_verify):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3 * 5, 50, generator=g)
    info = SimpleNamespace(is_all_greedy=True)
    got = ddtree_verify.sample_target_tokens_per_node(logits, info, 3, 5)
    assert torch.equal(got, logits.argmax(-1).view(3, 5))
