"""The tiny models: deterministic from the seed, and tree verify computes exactly the sequential logits."""

from __future__ import annotations

import torch
from ddtree_refengine.models import BlockDrafter, ModelConfig, TinyTarget, build_target


def _sequential_logits(target: TinyTarget, tokens: list[int]) -> torch.Tensor:
    """Logits after each token, feeding one token per forward (the autoregressive path)."""
    cache = target.new_cache(len(tokens) + 1)
    rows = []
    for i, tok in enumerate(tokens):
        logits, _ = target.forward(torch.tensor([tok]), torch.tensor([i]), cache)
        cache.length += 1
        rows.append(logits[0])
    return torch.stack(rows)


def test_same_seed_same_model_other_seed_other_model():
    cfg = ModelConfig(seed=3)
    a, b = TinyTarget(cfg), TinyTarget(cfg)
    other = TinyTarget(ModelConfig(seed=4))
    tokens = [256, 72, 105, 33]
    la, lb, lo = (_sequential_logits(m, tokens) for m in (a, b, other))
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lo)


def test_prefill_equals_one_token_at_a_time():
    target = build_target(ModelConfig())
    tokens = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    cache = target.new_cache(64)
    prefill, _ = target.forward(torch.tensor(tokens), torch.arange(len(tokens)), cache)
    assert (prefill - _sequential_logits(target, tokens)).abs().max() < 1e-9


def test_isolated_hidden_equals_forward_on_one_token():
    target = build_target(ModelConfig())
    tokens, positions = torch.tensor([0, 65, 200, 259]), torch.tensor([0, 7, 31, 500])
    iso = target.isolated_hidden(tokens, positions)
    for i in range(len(tokens)):
        cache = target.new_cache(1)
        _, hidden = target.forward(tokens[i : i + 1], positions[i : i + 1], cache)
        assert (iso[i] - hidden[0]).abs().max() < 1e-12


def test_tree_verify_logits_equal_each_nodes_ancestor_path(runtime):
    """One tree forward (ancestor mask, depth positions over the cached prefix) == running each path alone."""
    target = build_target(ModelConfig())
    drafter = BlockDrafter(target, block_size=5)
    prompt = [256, *b"tree verify"]
    cache = target.new_cache(len(prompt) + 64)
    _, hidden = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), cache)
    cache.length = len(prompt)
    root = 101
    draft = drafter.draft(root, cache.length, prompt[-1], hidden[-1])[None]
    lp, tok = runtime.draft_topk(draft, 8)
    tree = runtime.build_tree(lp, tok, torch.tensor([root]), 24)
    vin = runtime.build_verify_inputs(tree, torch.tensor([cache.length]))
    assert int(tree.depth.max()) >= 2 and int((tree.depth == 1).sum()) >= 2  # really a branching tree
    logits, _ = target.forward(tree.token[0], vin.positions[0], cache, vin.mask[0])
    parent = tree.parent[0].tolist()
    for node in range(tree.token.shape[1]):
        path, cur = [], node
        while cur >= 0:
            path.append(int(tree.token[0, cur]))
            cur = parent[cur]
        seq = torch.tensor(prompt + path[::-1])
        expected, _ = target.forward(seq, torch.arange(len(seq)), target.new_cache(len(seq)))  # causal prefill
        expected = expected[-1]
        assert (logits[node] - expected).abs().max() < 1e-9, f"node {node}"
