"""Input makers and comparisons shared by the runtime tests (real data paths, no mocks)."""
from __future__ import annotations

import numpy as np
import torch

TREE_FIELDS = ("token", "parent", "depth", "score", "first_child", "next_sibling", "num_nodes")
VERIFY_FIELDS = ("positions", "mask", "packed_mask", "retrive_index", "retrive_next_token", "retrive_next_sibling")
WALK_FIELDS = ("accepted_nodes", "accept_len", "accepted_tokens", "bonus_token")


def random_logits(gen: torch.Generator, batch: int, depth: int, vocab: int, kind: str = "normal") -> torch.Tensor:
    """Draft logits of several flavours: continuous, small integers (many exact ties), all equal, peaked."""
    if kind == "normal":
        return torch.randn(batch, depth, vocab, generator=gen) * 2.0
    if kind == "ties":
        return torch.randint(-2, 2, (batch, depth, vocab), generator=gen).float()
    if kind == "equal":
        return torch.zeros(batch, depth, vocab)
    if kind == "peaked":  # one dominant token per depth: the best tree is a chain to max depth
        x = torch.randn(batch, depth, vocab, generator=gen)
        x.scatter_(2, torch.randint(0, vocab, (batch, depth, 1), generator=gen), 40.0)
        return x
    raise ValueError(kind)


def extreme_logits(gen: torch.Generator, vocab: int) -> torch.Tensor:
    """[1, 4, vocab]: -inf every third token (masked), one huge and one hugely negative finite logit, signed
    zeros alternating (+0.0 ranks above -0.0 in the key order), and a row with only 5 finite entries."""
    x = random_logits(gen, 1, 4, vocab, "normal")
    x[0, 0, ::3] = float("-inf")
    x[0, 1, 40] = 3e38
    x[0, 1, 90] = -3e38
    x[0, 2] = torch.where(torch.arange(vocab) % 2 == 0, torch.tensor(0.0), torch.tensor(-0.0))
    x[0, 3, 5:] = float("-inf")
    return x


def expected_topk(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent check: full stable sort in numpy of the fp32 logits, ties by token id; log-probs of those."""
    x = logits.float()
    lp = (x - torch.logsumexp(x, -1, keepdim=True)).numpy()
    xs = x.numpy()
    batch, depth, vocab = lp.shape
    out_lp = np.empty((batch, depth, k), np.float32)
    out_tok = np.empty((batch, depth, k), np.int64)
    for b in range(batch):
        for d in range(depth):
            order = np.lexsort((np.arange(vocab), -xs[b, d].astype(np.float64)))[:k]
            out_lp[b, d], out_tok[b, d] = lp[b, d, order], order
    return out_lp, out_tok


def assert_same(a, b, fields, what: str = "") -> None:
    for f in fields:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f"{what}{f}: dtype {x.dtype} != {y.dtype}"
        assert x.shape == y.shape, f"{what}{f}: shape {tuple(x.shape)} != {tuple(y.shape)}"
        assert torch.equal(x.cpu(), y.cpu()), f"{what}{f} differs:\n{x}\n{y}"


def plant_targets(tree, gen: torch.Generator, vocab: int, p_follow: float = 0.8) -> torch.Tensor:
    """Target tokens that follow a random child with probability p_follow at every node (else a random token)."""
    batch, n1 = tree.parent.shape
    target = torch.randint(0, vocab, (batch, n1), generator=gen)
    parent = tree.parent.cpu()
    token = tree.token.cpu()
    for b in range(batch):
        for i in range(int(tree.num_nodes[b])):
            kids = (parent[b] == i).nonzero().flatten()
            if len(kids) and float(torch.rand((), generator=gen)) < p_follow:
                target[b, i] = token[b, kids[int(torch.randint(0, len(kids), (), generator=gen))]]
    return target.to(tree.parent.device)


def python_walk(parent: list[int], token: list[int], target: list[int], max_depth: int):
    """The reference implementation's dict walk: children by token, descend while the target matches."""
    children: dict[int, dict[int, int]] = {}
    for i, p in enumerate(parent):
        if p >= 0:
            children.setdefault(p, {})[token[i]] = i
    path, cur = [0], 0
    while len(path) <= max_depth and target[cur] in children.get(cur, {}):
        cur = children[cur][target[cur]]
        path.append(cur)
    return path, [target[n] for n in path]


def np_f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)
