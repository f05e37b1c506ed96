"""The spec-v2 integration's torch-only parts against plain references, on fresh random inputs: the per-depth top-k
over a (sharded) LM head, the graph-foldable tree builder, and the per-node target sampler.

The modules are loaded by path from patches/ddtree/spec-v2 (as the overlay vendors them); their `runtime()` hook
is pointed at the runtime loaded the same way, since `sglang.srt.speculative.ddtree` is not importable here.
"""
from __future__ import annotations

import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import spec_v2_tables
from v2_helpers import REPO

sys.path.insert(0, str(REPO / "tests" / "runtime"))
from rt_env import load_runtime  # noqa: E402

RT = load_runtime()


def _load(name: str):
    return spec_v2_tables.load(name)


DT = _load("draft_topk")
DT.runtime = lambda: RT
SAMPLING = _load("sampling")


def _shard(start, num, padded, added_start=0, num_added=0):
    return SimpleNamespace(org_vocab_start_index=start, num_org_elements=num, num_org_elements_padded=padded,
                           added_vocab_start_index=added_start, num_added_elements=num_added)


def _head(w, shard=None):
    return SimpleNamespace(weight=w, shard_indices=shard) if shard is not None else SimpleNamespace(weight=w)


def _ref_topk(logits, k):
    lp = torch.log_softmax(logits.float(), -1)
    # descending log-prob, ties by ascending id: sort ids first, then a stable sort by value
    order = torch.argsort(-lp, dim=-1, stable=True)
    return lp.gather(1, order[:, :k]), order[:, :k]


@pytest.mark.parametrize("tp,per,k", [(2, 20, 8), (3, 20, 12), (4, 16, 10), (2, 5, 9), (3, 4, 12)])
def test_merge_shard_topk_equals_full_vocab_topk(tp, per, k):
    """Each rank keeps min(k, its shard) candidates, as draft_topk does: the merge is exact, ties included."""
    g = torch.Generator().manual_seed(tp * 100 + k)
    m = 7
    kk = min(k, per)
    logits = torch.randint(-3, 3, (m, tp * per), generator=g).float()  # many exact ties
    vals, ids, lse = [], [], []
    for r in range(tp):
        part = logits[:, r * per:(r + 1) * per]
        order = torch.argsort(-part, dim=-1, stable=True)[:, :kk]  # what each rank's topk of raw logits keeps
        vals.append(part.gather(1, order))
        ids.append(order + r * per)
        lse.append(torch.logsumexp(part, -1))
    lp, tok = DT.merge_shard_topk(torch.stack(vals), torch.stack(ids), torch.stack(lse), k)
    got = min(k, tp * kk)
    want_lp, want_tok = _ref_topk(logits, got)
    assert torch.allclose(lp[:, :got], want_lp, atol=1e-5)
    assert torch.equal(tok[:, :got], want_tok), "descending, ties by ascending token id"
    if got < k:
        assert torch.isinf(lp[:, got:]).all() and (tok[:, got:] == 0).all()


def test_single_rank_topk_with_added_vocab_maps_ids():
    g = torch.Generator().manual_seed(4)
    V, A, H = 40, 3, 8
    w = torch.randn(48 + A, H, generator=g)
    shard = DT.HeadShard.of(_head(w, _shard(0, V, 48, added_start=V, num_added=A)))
    hs = torch.randn(5, H, generator=g)
    lp, tok = DT.draft_topk(hs, shard, 10)
    full = torch.cat([hs @ w[:V].T, hs @ w[48:48 + A].T], -1)
    want_lp, want_tok = _ref_topk(full, 10)
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.equal(tok, want_tok)


def test_topk_caps_at_the_vocab_and_pads():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(6, 4, generator=g)
    lp, tok = DT.draft_topk(torch.randn(3, 4, generator=g), DT.HeadShard.of(_head(w)), 9)
    assert lp.shape == tok.shape == (3, 9)
    assert torch.isinf(lp[:, 6:]).all() and torch.isfinite(lp[:, :6]).all()
    assert sorted(tok[0, :6].tolist()) == list(range(6))


def _tp_rank(rank, world, port, hs, w, k, q):
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    dt = _load("draft_topk")
    dt.runtime = lambda: RT
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    class Group:  # the members of SGLang's GroupCoordinator the draft top-k uses, over real gloo
        world_size = world

        @staticmethod
        def all_gather_into_tensor(out, inp):
            parts = list(out.view(world, -1).unbind(0))
            dist.all_gather(parts, inp.contiguous())
            out.copy_(torch.stack(parts).view(-1))

    per = w.shape[0] // world
    shard = dt.HeadShard.of(_head(w[rank * per:(rank + 1) * per], _shard(rank * per, per, per)))
    lp, tok = dt.draft_topk(hs, shard, k, tp_group=Group())
    if rank == 0:  # plain lists: a tensor would be shared through a descriptor that dies with this process
        q.put((lp.tolist(), tok.tolist()))
    dist.destroy_process_group()


def test_tensor_parallel_topk_gathers_only_candidates():
    """Two real gloo ranks each own half the vocab: the merged result equals the full-vocab top-k."""
    import torch.multiprocessing as mp

    g = torch.Generator().manual_seed(5)
    V, H, n, k = 128, 16, 21, 12
    w, hs = torch.randn(V, H, generator=g), torch.randn(n, H, generator=g)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_tp_rank, args=(r, 2, port, hs, w, k, q)) for r in range(2)]
    for p in procs:
        p.start()
    lp, tok = (torch.tensor(x) for x in q.get(timeout=180))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    want_lp, want_tok = _ref_topk(hs @ w.T, k)
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.equal(tok, want_tok)


@pytest.mark.parametrize("block,budget,bs,max_bs", [(8, 15, 3, 4), (4, 1, 2, 2), (16, 64, 1, 3), (5, 40, 4, 4)])
def test_tree_builder_graph_buffers_equal_the_eager_build(block, budget, bs, max_bs):
    g = torch.Generator().manual_seed(block * budget)
    V, H = 50, 12
    w = torch.randn(V, H, generator=g)
    b = DT.DraftTreeBuilder(lm_head=_head(w), block_size=block, budget=budget, vocab_size=V, max_bs=max_bs,
                            device="cpu")
    hidden = torch.randn(bs * block, H, generator=g)
    ids = torch.randint(0, V, (bs * block,), generator=g)
    eager = b.build(hidden, ids.view(bs, block)[:, 0])
    # the reference: the runtime's own steps on the positions' log-probs
    lp, tok = _ref_topk(hidden.view(bs, block, H)[:, 1:].reshape(-1, H) @ w.T, min(budget, V))
    tree = RT.build_tree(lp.view(bs, block - 1, -1), tok.view(bs, block - 1, -1), ids.view(bs, block)[:, 0],
                         budget, impl="torch")
    vin = RT.build_verify_inputs(tree, torch.zeros(bs, dtype=torch.long), impl="torch")
    for f in ("token", "parent", "depth", "first_child", "next_sibling", "num_nodes"):
        assert torch.equal(getattr(eager.tree, f), getattr(tree, f)), f
    assert torch.equal(eager.mask, vin.mask)
    b(hidden, ids)  # the capture-hook body: into the fixed buffers
    got = b.read(bs)
    for f in ("token", "parent", "depth", "score", "first_child", "next_sibling", "num_nodes"):
        assert torch.equal(getattr(got.tree, f), getattr(eager.tree, f)), f
    assert got.tree.max_depth == block - 1
    assert torch.equal(got.mask, eager.mask)
    assert torch.equal(got.next_token, eager.next_token) and torch.equal(got.next_sibling, eager.next_sibling)


def test_tree_builder_from_a_hook_without_input_ids():
    """0.5.15's draft-graph hook passes only the hidden states: the tree is built with a stand-in root and the real
    roots are written in by read(); the result equals the eager build, and read() without roots is refused."""
    g = torch.Generator().manual_seed(31)
    block, budget, bs, V, H = 6, 20, 3, 40, 10
    w = torch.randn(V, H, generator=g)
    b = DT.DraftTreeBuilder(lm_head=_head(w), block_size=block, budget=budget, vocab_size=V, max_bs=4, device="cpu")
    hidden = torch.randn(bs * block, H, generator=g)
    roots = torch.randint(0, V, (bs,), generator=g)
    eager = b.build(hidden, roots)
    b(hidden)  # the 0.5.15 hook: dflash_draft_sampler(out.hidden_states)
    assert not b.roots_in_graph
    with pytest.raises(RuntimeError, match="root tokens"):
        b.read(bs)
    got = b.read(bs, roots)
    for f in ("token", "parent", "depth", "score", "first_child", "next_sibling", "num_nodes"):
        assert torch.equal(getattr(got.tree, f), getattr(eager.tree, f)), f
    assert torch.equal(got.mask, eager.mask)
    b(hidden, torch.cat([roots[:, None], torch.zeros(bs, block - 1, dtype=torch.long)], 1).view(-1))
    assert b.roots_in_graph and torch.equal(b.read(bs).tree.token, eager.tree.token)


def test_per_node_sampling_greedy_and_top_k_one():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3 * 5, 50, generator=g)
    greedy = SimpleNamespace(is_all_greedy=True)
    assert torch.equal(SAMPLING.target_tokens_per_node(logits, greedy, 3, 5), logits.argmax(-1).view(3, 5))


def test_per_node_temperature_sampling_follows_the_law():
    """Gumbel-max per node draws from softmax(x / T): chi-square over many nodes of one row."""
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(9)
    V, n1, T = 6, 4000, 1.7
    row = torch.randn(V, generator=g) * 1.5
    logits = row.expand(2 * n1, V).contiguous()
    info = SimpleNamespace(is_all_greedy=False, temperatures=torch.tensor([[T], [T]]), need_top_k_sampling=False,
                           need_top_p_sampling=False, need_min_p_sampling=False)
    got = SAMPLING.target_tokens_per_node(logits, info, 2, n1, generator=g)
    assert got.shape == (2, n1)
    counts = torch.bincount(got.view(-1), minlength=V).double()
    expect = torch.softmax(row.double() / T, -1) * counts.sum()
    assert chisquare(counts.numpy(), expect.numpy()).pvalue > 1e-3
    # independent draws per node: not all nodes of a request got the same token
    assert len(set(got[0].tolist())) > 1
