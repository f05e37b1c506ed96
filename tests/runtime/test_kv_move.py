"""move_path_kv: on a paged KV cache the accepted path's KV rows are copied to the slots of their positions; the
kernel (one launch for every layer) and the reference both give what the definition says, reading every row before
it is overwritten: fresh random trees and paths, paths whose later nodes sit in slots an earlier column writes,
-1 padding, src == dst, several buffers (layers' K and V); and the buffers' checks."""
from __future__ import annotations

import pytest
import torch
from rt_env import needs_triton


def _paths(gen, batch: int, n1: int, depth: int):
    """Random trees (parents before children) and a random root-to-node path in each: accepted_nodes [B, depth+1]
    with -1 padding, and distinct verify slots per request (shuffled)."""
    nodes = torch.full((batch, depth + 1), -1, dtype=torch.int32)
    for b in range(batch):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n1)]
        leaf = int(torch.randint(0, n1, (1,), generator=gen))
        path = []
        while leaf >= 0:
            path.append(leaf)
            leaf = parent[leaf]
        path = path[::-1][: depth + 1]
        nodes[b, : len(path)] = torch.tensor(path, dtype=torch.int32)
    slots = torch.randperm(batch * n1 + 7, generator=gen)[: batch * n1].view(batch, n1)
    return nodes, slots


def _pairs(rt, nodes, slots):
    walk = rt.WalkResult(accepted_nodes=nodes, accept_len=(nodes >= 0).sum(1).to(torch.int32) - 1,
                         accepted_tokens=torch.zeros(nodes.shape, dtype=torch.int64),
                         bonus_token=torch.zeros(nodes.shape[0], dtype=torch.int64))
    return rt.kv_compaction(walk, slots, impl="torch")


def _oracle(buffers, src, dst):
    """Every row read from the buffers as they were before the move."""
    out = [b.clone() for b in buffers]
    for b in range(src.shape[0]):
        for c in range(src.shape[1]):
            s, d = int(src[b, c]), int(dst[b, c])
            if s >= 0 and d >= 0:
                for o, old in zip(out, buffers, strict=True):
                    o[d] = old[s]
    return out


def _buffers(gen, n, slots, shape, dtype, device):
    return [torch.randn((slots, *shape), generator=gen).to(dtype).to(device) for _ in range(n)]


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("case", [(5, 17, 15, (2, 8), 4), (3, 65, 15, (3, 4), 2), (1, 4, 3, (1, 16), 6),
                                  (6, 9, 8, (2, 5), 1)])
def test_move_equals_the_definition(rt, gen, dev, impl, case):
    batch, n1, depth, shape, nbuf = case
    nodes, slots = _paths(gen, batch, n1, depth)
    src, dst = _pairs(rt, nodes, slots)
    device = dev if impl == "triton" else torch.device("cpu")
    bufs = _buffers(gen, nbuf, batch * n1 + 7, shape, torch.bfloat16 if device.type == "cuda" else torch.float32,
                    device)
    want = _oracle([b.cpu() for b in bufs], src, dst)
    rt.move_path_kv(rt.KVRows(bufs), src.to(device), dst.to(device), impl=impl)
    for got, exp in zip(bufs, want, strict=True):
        assert torch.equal(got.cpu(), exp)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_a_slot_read_before_it_is_written(rt, dev, impl):
    """Path 0 -> 2 -> 3 -> 4: column 1 reads slot 2, which column 2 writes; column 2 reads slot 3, column 3 writes it.
    Copied all at once without order, a later column's write would land before an earlier read."""
    nodes = torch.tensor([[0, 2, 3, 4, -1]], dtype=torch.int32)
    slots = torch.tensor([[10, 11, 12, 13, 14, 15]])
    src, dst = _pairs(rt, nodes, slots)
    device = dev if impl == "triton" else torch.device("cpu")
    buf = torch.arange(20 * 3, dtype=torch.float32).view(20, 3).to(device)
    rt.move_path_kv(rt.KVRows([buf]), src.to(device), dst.to(device), impl=impl)
    rows = buf.cpu()[:, 0].div(3).to(torch.int64).tolist()
    assert rows[10:15] == [10, 12, 13, 14, 14], "position c holds the path's node c; the rest stays"


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_padding_and_identity_are_skipped(rt, dev, impl):
    device = dev if impl == "triton" else torch.device("cpu")
    buf = torch.arange(8 * 2, dtype=torch.float32).view(8, 2).to(device)
    before = buf.clone()
    src = torch.tensor([[3, -1, 5], [2, 2, -1]], device=device)
    dst = torch.tensor([[3, 4, -1], [1, 2, 6]], device=device)
    rt.move_path_kv(rt.KVRows([buf]), src, dst, impl=impl)
    want = before.clone()
    want[1] = before[2]
    assert torch.equal(buf, want)


def test_buffers_are_checked(rt):
    a = torch.zeros((6, 2, 4))
    with pytest.raises(ValueError, match="buffer 1: .* differs from buffer 0"):
        rt.KVRows([a, torch.zeros((6, 2, 4), dtype=torch.float16)])
    with pytest.raises(ValueError, match="buffer 0: rows are not contiguous"):
        rt.KVRows([torch.zeros((2, 6, 4)).transpose(0, 1)])
    with pytest.raises(ValueError, match="at least one buffer"):
        rt.KVRows([])
    rows = rt.KVRows([a, torch.ones((6, 2, 4))])
    assert rows.row == 8 and rows.ptrs.tolist() == [rows.buffers[0].data_ptr(), rows.buffers[1].data_ptr()]
