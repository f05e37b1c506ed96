"""DDTree runtime kernels on a real GPU: compiled Triton vs the torch references at serving sizes.

Pytest tests, marked ``gpu`` and skipped without CUDA: ``python -m pytest -m gpu tests/gpu/test_runtime_gpu.py``
(or ``make test-gpu``). Inputs are random with a per-run seed
(``DDTREE_TEST_SEED`` replays one). Speed is measured in bench/bench_runtime.py, never here.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_DIR = ROOT / "patches" / "ddtree" / "runtime"
sys.path[:0] = [str(ROOT / "tests" / "runtime"), str(ROOT)]
from ddtree_deploy.sandbox.refengine.runtime_loader import load_runtime  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SEED = int(os.environ.get("DDTREE_TEST_SEED", str(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)))
TREE_FIELDS = ("token", "parent", "depth", "score", "first_child", "next_sibling", "num_nodes")
VERIFY_FIELDS = ("positions", "mask", "packed_mask", "retrive_index", "retrive_next_token", "retrive_next_sibling")
WALK_FIELDS = ("accepted_nodes", "accept_len", "accepted_tokens", "bonus_token")
L = 15
VOCAB = 151_936


rt = load_runtime(RUNTIME_DIR)


def _gen(salt: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(SEED * 7919 + salt)
    return g


def _assert_same(a, b, fields, what: str) -> None:
    for f in fields:
        x, y = getattr(a, f), getattr(b, f)
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what}.{f}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        if not torch.equal(x, y):
            bad = (x != y).nonzero()[:5].tolist()
            raise AssertionError(f"{what}.{f} differs at {bad} (seed {SEED})")


def _inputs(batch: int, vocab: int, budget: int, kind: str, salt: int):
    g = _gen(salt)
    if kind == "ties":
        logits = torch.randint(-3, 3, (batch, L, vocab), device="cuda", generator=g).float()
    elif kind == "peaked":
        logits = torch.randn(batch, L, vocab, device="cuda", generator=g)
        logits.scatter_(2, torch.randint(0, vocab, (batch, L, 1), device="cuda", generator=g), 60.0)
    else:
        logits = torch.randn(batch, L, vocab, device="cuda", generator=g) * 2.5
    lp, tok = rt.draft_topk(logits, min(budget, vocab), impl="torch")
    roots = torch.randint(0, vocab, (batch,), device="cuda", generator=g)
    return lp, tok, roots


def _planted(tree, vocab: int, salt: int, p_follow: float = 0.85) -> torch.Tensor:
    g = _gen(salt)
    fc = tree.first_child.long()
    n_kids = torch.zeros_like(fc)
    n_kids.scatter_add_(1, tree.parent.long().clamp(min=0), (tree.parent >= 0).long())
    # follow a random child: the j-th child of node i is reached by walking next_sibling j times
    pick = (torch.rand(fc.shape, device="cuda", generator=g) * n_kids.clamp(min=1)).long()
    child = fc.clone()
    for _ in range(int(n_kids.max())):
        step = (pick > 0) & (child >= 0)
        child = torch.where(step, tree.next_sibling.long().gather(1, child.clamp(min=0)), child)
        pick = pick - 1
    child_tok = tree.token.gather(1, child.clamp(min=0))
    follow = (torch.rand(fc.shape, device="cuda", generator=g) < p_follow) & (child >= 0)
    return torch.where(follow, child_tok, torch.randint(0, vocab, fc.shape, device="cuda", generator=g))


def test_draft_topk_full_vocab():
    for salt, (batch, k, dtype, kind) in enumerate([(4, 64, torch.bfloat16, "normal"), (3, 64, torch.float32, "ties"),
                                                    (2, 16, torch.bfloat16, "peaked")]):
        g = _gen(100 + salt)
        if kind == "ties":
            logits = torch.randint(-3, 3, (batch, L, VOCAB), device="cuda", generator=g).to(dtype)
        else:
            logits = (torch.randn(batch, L, VOCAB, device="cuda", generator=g) * 2.5).to(dtype)
            if kind == "peaked":
                logits[:, :, 7] = 50
        lp_t, tok_t = rt.draft_topk(logits, k, impl="triton")
        lp_r, tok_r = rt.draft_topk(logits, k, impl="torch")
        assert torch.equal(tok_t, tok_r), f"tokens differ (batch {batch}, k {k}, {kind}, seed {SEED})"
        # the kernel's log-sum-exp is summed in another order than torch's: a few fp32 ulps
        torch.testing.assert_close(lp_t, lp_r, atol=4e-6, rtol=1e-6,
                                   msg=f"log-probs differ (batch {batch}, k {k}, {kind}, seed {SEED})")


def _check_oracle(tree, lp, tok, roots, budget, requests: int) -> None:
    from heap_oracle import heap_build, visibility

    vi = rt.build_verify_inputs(tree, torch.zeros_like(roots), impl="torch")
    for b in range(requests):
        o = heap_build(lp[b].cpu().numpy(), tok[b].cpu().numpy(), int(roots[b]), budget)
        n = o.num_nodes
        assert int(tree.num_nodes[b]) == n, (budget, b, int(tree.num_nodes[b]), n)
        assert tree.token[b, :n].tolist() == o.token and tree.parent[b, :n].tolist() == o.parent
        assert tree.score[b, :n].tolist() == o.score and tree.depth[b, :n].tolist() == o.depth
        assert (vi.mask[b, :n, :n].cpu().numpy() == visibility(o.parent)).all()


TREE_CASES = [  # (batch, vocab, budget, kind); the slow-to-compile budget 1024 last
    (8, 4096, 1, "normal"), (8, 4096, 16, "normal"), (32, 4096, 64, "normal"), (8, 4096, 64, "ties"),
    (8, 4096, 256, "normal"), (4, 4096, 256, "ties"), (4, 3, 16, "normal"), (4, 4096, 64, "peaked"),
]  # budget 1024 (slow to compile) has its own test, run last


def test_build_tree_and_verify_inputs():
    from ddtree_runtime.tree_triton import build_tree_triton

    for salt, (batch, vocab, budget, kind) in enumerate(TREE_CASES):
        lp, tok, roots = _inputs(batch, vocab, budget, kind, 200 + salt)
        what = f"B{batch} V{vocab} N{budget} {kind}"
        ref = rt.build_tree(lp, tok, roots, budget, impl="torch")
        for use_gather, merge_at_end in [(False, True), (True, True), (False, False), (True, False)]:
            got = build_tree_triton(lp, tok, roots, budget, use_gather=use_gather, merge_at_end=merge_at_end)
            _assert_same(got, ref, TREE_FIELDS, f"tree[{what}, gather={use_gather}, merge_at_end={merge_at_end}]")
        if budget == 64 and kind == "normal":  # launch widths the benchmark sweeps
            for warps in (1, 2, 8):
                got = build_tree_triton(lp, tok, roots, budget, num_warps=warps)
                _assert_same(got, ref, TREE_FIELDS, f"tree[{what}, num_warps={warps}]")
        _check_oracle(ref, lp, tok, roots, budget, requests=2)
        committed = torch.randint(0, 100_000, (batch,), device="cuda", generator=_gen(300 + salt))
        _assert_same(rt.build_verify_inputs(ref, committed, impl="triton"),
                     rt.build_verify_inputs(ref, committed, impl="torch"), VERIFY_FIELDS, f"verify[{what}]")


def test_accept_walk_and_compaction():
    from rt_helpers import python_walk

    for salt, (batch, vocab, budget, kind) in enumerate([(16, 4096, 64, "normal"), (8, 4096, 16, "peaked"),
                                                         (8, 4096, 1, "normal")]):
        lp, tok, roots = _inputs(batch, vocab, budget, kind, 400 + salt)
        tree = rt.build_tree(lp, tok, roots, budget, impl="triton")
        for p_follow in (0.0, 0.85, 1.0):
            target = _planted(tree, vocab, 500 + salt, p_follow)
            walk = rt.accept_walk(tree, target, impl="triton")
            ref = rt.accept_walk(tree, target, impl="torch")
            _assert_same(walk, ref, WALK_FIELDS, f"walk[N{budget} {kind} p{p_follow}]")
            for b in range(2):
                path, _ = python_walk(tree.parent[b].tolist(), tree.token[b].tolist(), target[b].tolist(), L)
                assert walk.accepted_nodes[b, :len(path)].tolist() == path
            if p_follow == 1.0:  # every inner node's target is one of its children: walks end at leaves
                last = walk.accepted_nodes.long().gather(1, walk.accept_len.long().view(-1, 1))
                assert tree.first_child.long().gather(1, last).eq(-1).all()
            slots = torch.randperm(batch * (budget + 1), device="cuda", generator=_gen(600 + salt)).view(batch, -1)
            src, dst = rt.kv_compaction(walk, slots, impl="triton")
            src_r, dst_r = rt.kv_compaction(ref, slots, impl="torch")
            assert torch.equal(src, src_r) and torch.equal(dst, dst_r)


def test_sample_target_tokens():
    g = _gen(700)
    x = (torch.randn(2, 65, VOCAB, device="cuda", generator=g) * 3).to(torch.bfloat16)
    x[:, :3, 11] = x[:, :3, 5] = 40  # equal maxima: the first index wins
    greedy = rt.sample_target_tokens(x, 0.0, impl="triton")
    assert torch.equal(greedy, rt.sample_target_tokens(x, 0.0, impl="torch"))
    assert greedy[:, :3].eq(5).all()
    mixed = rt.sample_target_tokens(x, torch.tensor([0.0, 1.0], device="cuda"), impl="triton")
    assert torch.equal(mixed[0], greedy[0])
    base = torch.tensor([1.0, 0.0, -1.0, 0.5, -0.3], device="cuda")
    for temperature in (1.0, 0.5):
        probs = torch.softmax(base / temperature, 0)
        draws = rt.sample_target_tokens(base.expand(8, 1025, 5).contiguous(), temperature, generator=g,
                                        impl="triton")
        counts = torch.bincount(draws.flatten(), minlength=5).double()
        expected = probs.double() * draws.numel()
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 23.51, f"chi-square {chi2:.1f} at T={temperature} (4 df, p=1e-4 threshold)"


def test_round_has_no_host_sync_and_replays_in_a_cuda_graph():
    batch, budget, vocab = 8, 64, VOCAB
    g = _gen(800)
    logits = (torch.randn(batch, L, vocab, device="cuda", generator=g) * 2.5).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (batch,), device="cuda", generator=g)
    committed = torch.randint(0, 5000, (batch,), device="cuda", generator=g)
    slots = torch.randperm(batch * (budget + 1), device="cuda", generator=g).view(batch, -1)
    target_logits = torch.randn(batch, budget + 1, 512, device="cuda", generator=g)

    def round_fn():
        lp, tok = rt.draft_topk(logits, budget)
        tree = rt.build_tree(lp, tok, roots, budget)
        vi = rt.build_verify_inputs(tree, committed)
        target = rt.sample_target_tokens(target_logits, 0.0)
        walk = rt.accept_walk(tree, target)
        src, dst = rt.kv_compaction(walk, slots)
        return tree, vi, walk, src, dst

    round_fn()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        round_fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        round_fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = round_fn()
    for step in range(3):  # new inputs each replay, as a serving loop does
        logits.copy_((torch.randn(logits.shape, device="cuda", generator=g) * 2.5).to(torch.bfloat16))
        roots.copy_(torch.randint(0, vocab, (batch,), device="cuda", generator=g))
        target_logits.copy_(torch.randn(target_logits.shape, device="cuda", generator=g))
        graph.replay()
        tree, vi, walk, src, dst = round_fn()
        _assert_same(static[0], tree, TREE_FIELDS, f"graph tree step {step}")
        _assert_same(static[1], vi, VERIFY_FIELDS, f"graph verify step {step}")
        _assert_same(static[2], walk, WALK_FIELDS, f"graph walk step {step}")
        assert torch.equal(static[3], src) and torch.equal(static[4], dst)


def test_zz_budget_1024():
    """The largest budget end to end: top-k 1024 over the full vocab, tree (== heap oracle), verify, walk."""
    g = _gen(900)
    logits = (torch.randn(2, L, VOCAB, device="cuda", generator=g) * 2.5).to(torch.bfloat16)
    lp, tok = rt.draft_topk(logits, 1024, impl="triton")
    lp_r, tok_r = rt.draft_topk(logits, 1024, impl="torch")
    assert torch.equal(tok, tok_r)
    torch.testing.assert_close(lp, lp_r, atol=4e-6, rtol=1e-6)
    for salt, (batch, kind) in enumerate([(4, "normal"), (2, "ties")]):
        lp, tok, roots = _inputs(batch, 4096, 1024, kind, 910 + salt)
        tree = rt.build_tree(lp, tok, roots, 1024, impl="triton")
        _assert_same(tree, rt.build_tree(lp, tok, roots, 1024, impl="torch"), TREE_FIELDS, f"tree[N1024 {kind}]")
        _check_oracle(tree, lp, tok, roots, 1024, requests=2)
        committed = torch.randint(0, 100_000, (batch,), device="cuda", generator=g)
        _assert_same(rt.build_verify_inputs(tree, committed, impl="triton"),
                     rt.build_verify_inputs(tree, committed, impl="torch"), VERIFY_FIELDS, f"verify[N1024 {kind}]")
        target = _planted(tree, 4096, 920 + salt)
        _assert_same(rt.accept_walk(tree, target, impl="triton"), rt.accept_walk(tree, target, impl="torch"),
                     WALK_FIELDS, f"walk[N1024 {kind}]")


def test_self_test_on_gpu():
    report = rt.self_test("cuda")
    assert report["ok"] and report["impl"] == "triton", report

