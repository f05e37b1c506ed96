"""tree_verify_attention: the kernel (grouped query heads per tile, the context split across programs and merged)
equals the torch reference on fresh random inputs, and the reference equals a float64 loop over the definition;
edge cases: an empty context with several splits, a context that is not a whole number of tiles, a request with
fewer tokens than the verify width or none, one KV head per query head, head dim 256, the mask as bool or uint8,
and context columns of the mask that hold garbage (never read)."""
from __future__ import annotations

import math

import pytest
import torch
from rt_env import needs_triton


def _tree_masks(gen, n: int, batch: int) -> torch.Tensor:
    """bool [batch, n, n]: random trees in parent-before-child order (node 0 the root), ancestors visible."""
    out = torch.zeros((batch, n, n), dtype=torch.bool)
    for b in range(batch):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        for i in range(n):
            j = i
            while j >= 0:
                out[b, i, j] = True
                j = parent[j]
    return out


def _case(gen, *, prefixes, lens, n, hq, hkv, d, dv=None, dtype=torch.float32, garbage=True, device="cpu"):
    """Random q / k / v, a pool with shuffled slots, SGLang's flat mask with the tree block of random trees."""
    dv = dv or d
    batch = len(prefixes)
    tokens = sum(lens)
    slots = sum(prefixes) + 13
    perm = torch.randperm(slots, generator=gen)
    kv_indices = perm[: sum(prefixes)].to(torch.int32)
    kv_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(prefixes), 0)), dtype=torch.int32)
    qo_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32)
    seg = [ln * (p + ln) for p, ln in zip(prefixes, lens, strict=True)]
    mask_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(seg), 0)), dtype=torch.int64)
    fill = torch.randint(0, 2, (sum(seg) + 5,), generator=gen, dtype=torch.uint8) if garbage else \
        torch.zeros((sum(seg) + 5,), dtype=torch.uint8)
    trees = _tree_masks(gen, n, batch)
    for b in range(batch):
        ln, p = lens[b], prefixes[b]
        for i in range(ln):
            row = int(mask_indptr[b]) + i * (p + ln)
            fill[row + p: row + p + ln] = trees[b, i, :ln].to(torch.uint8)

    def rnd(*shape):
        return torch.randn(shape, generator=gen).to(dtype)

    t = dict(q=rnd(tokens, hq, d), k_ext=rnd(tokens, hkv, d), v_ext=rnd(tokens, hkv, dv),
             k_buf=rnd(slots, hkv, d), v_buf=rnd(slots, hkv, dv), qo_indptr=qo_indptr, kv_indptr=kv_indptr,
             kv_indices=kv_indices, mask=fill, mask_indptr=mask_indptr)
    t = {k: v.to(device) for k, v in t.items()}
    t["o"] = torch.full((tokens, hq, dv), float("nan"), dtype=dtype, device=device)
    return t


def _oracle(c, sm_scale) -> torch.Tensor:
    """float64, one query at a time, straight from the definition."""
    q, k_ext, v_ext = c["q"].double().cpu(), c["k_ext"].double().cpu(), c["v_ext"].double().cpu()
    k_buf, v_buf = c["k_buf"].double().cpu(), c["v_buf"].double().cpu()
    qo, kv, mk = (c[x].cpu().tolist() for x in ("qo_indptr", "kv_indptr", "mask_indptr"))
    idx, mask = c["kv_indices"].cpu().tolist(), c["mask"].cpu().view(-1).tolist()
    hq, hkv = q.shape[1], k_ext.shape[1]
    out = torch.zeros((q.shape[0], hq, v_ext.shape[-1]), dtype=torch.float64)
    for b in range(len(qo) - 1):
        n, p = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        for i in range(n):
            for h in range(hq):
                kh = h // (hq // hkv)
                keys, vals = [], []
                for j in range(p):
                    keys.append(k_buf[idx[kv[b] + j], kh])
                    vals.append(v_buf[idx[kv[b] + j], kh])
                for j in range(n):
                    if mask[mk[b] + i * (p + n) + p + j]:
                        keys.append(k_ext[qo[b] + j, kh])
                        vals.append(v_ext[qo[b] + j, kh])
                s = torch.stack(keys) @ q[qo[b] + i, h] * sm_scale
                w = torch.softmax(s, 0)
                out[qo[b] + i, h] = w @ torch.stack(vals)
    return out


def _run(rt, c, impl, **kw):
    o = c["o"].clone()
    return rt.tree_verify_attention(c["q"], c["k_ext"], c["v_ext"], o, c["k_buf"], c["v_buf"], c["qo_indptr"],
                                    c["kv_indptr"], c["kv_indices"], c["mask"], c["mask_indptr"], kw.pop("sm_scale"),
                                    kw.pop("max_len"), impl=impl, **kw)


def test_reference_equals_the_definition(rt, gen):
    c = _case(gen, prefixes=[5, 0, 9], lens=[4, 4, 3], n=4, hq=4, hkv=2, d=8)
    got = _run(rt, c, "torch", sm_scale=0.3, max_len=4)
    torch.testing.assert_close(got.double(), _oracle(c, 0.3), rtol=1e-5, atol=1e-5)


CASES = [  # prefixes, lens, n (verify width), hq, hkv, d, splits
    ([70, 3, 0], [9, 9, 9], 9, 8, 2, 32, 1),
    ([70, 3, 0], [9, 9, 9], 9, 8, 2, 32, 3),
    ([0, 0], [5, 5], 5, 4, 4, 16, 4),            # empty contexts, several splits: only the tree
    ([64, 65, 1], [6, 2, 6], 6, 6, 1, 32, 2),     # one KV head for six query heads; a short request
    ([33], [1], 1, 2, 1, 16, 1),                  # the root alone
    ([40, 7], [0, 4], 4, 4, 2, 16, 2),            # a request with no tokens
    ([20, 90], [17, 17], 17, 4, 1, 32, 5),        # a b16 tree's width, rows packed over two tiles of four heads
]


@needs_triton
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.bool])
def test_kernel_equals_reference(rt, gen, dev, case, mask_dtype):
    prefixes, lens, n, hq, hkv, d, splits = case
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    c = _case(gen, prefixes=prefixes, lens=lens, n=n, hq=hq, hkv=hkv, d=d, dtype=dtype, device=dev)
    c["mask"] = c["mask"].to(mask_dtype) if mask_dtype is torch.uint8 else c["mask"] != 0
    scale = 1.0 / math.sqrt(d)
    want = _run(rt, c, "torch", sm_scale=scale, max_len=n)
    got = _run(rt, c, "triton", sm_scale=scale, max_len=n, splits=splits)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    tokens = sum(lens)
    assert not torch.isnan(got[:tokens]).any()
    torch.testing.assert_close(got.float(), want.float(), **tol)


@needs_triton
def test_splits_do_not_change_the_result(rt, gen, dev):
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    c = _case(gen, prefixes=[130, 1, 64], lens=[5, 5, 5], n=5, hq=4, hkv=2, d=32, dtype=dtype, device=dev)
    outs = [_run(rt, c, "triton", sm_scale=0.2, max_len=5, splits=s).float() for s in (1, 2, 7, 16)]
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], **tol)


@needs_triton
def test_head_dim_256_and_value_dim(rt, gen, dev):
    """The Qwen3.6 attention layers' head dim (64-row tiles), and a value dim other than the key dim."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    c = _case(gen, prefixes=[37, 5], lens=[3, 3], n=3, hq=6, hkv=1, d=256, dv=128, dtype=dtype, device=dev)
    want = _run(rt, c, "torch", sm_scale=0.0625, max_len=3)
    got = _run(rt, c, "triton", sm_scale=0.0625, max_len=3, splits=2)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@needs_triton
def test_context_columns_of_the_mask_are_not_read(rt, gen, dev):
    """Zeroed or random context columns give the same output: the context is always visible."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = _case(gen, prefixes=[12, 30], lens=[4, 4], n=4, hq=2, hkv=1, d=16, dtype=dtype, device=dev)
    b = dict(a)
    m = a["mask"].clone()
    qo, kv, mk = (a[x].cpu().tolist() for x in ("qo_indptr", "kv_indptr", "mask_indptr"))
    for r in range(2):
        n, p = qo[r + 1] - qo[r], kv[r + 1] - kv[r]
        for i in range(n):
            row = mk[r] + i * (p + n)
            m[row: row + p] = 1 - m[row: row + p]  # flip every context cell
    b["mask"] = m
    ga = _run(rt, a, "triton", sm_scale=0.25, max_len=4, splits=2)
    gb = _run(rt, b, "triton", sm_scale=0.25, max_len=4, splits=2)
    assert torch.equal(ga, gb)


def test_overrides_are_checked(rt, monkeypatch):
    pytest.importorskip("triton")
    mod = __import__(rt.__name__ + ".tree_attn_triton", fromlist=["plan"])
    monkeypatch.setenv("DDTREE_TREE_ATTN", "bm=64,warps=x")
    with pytest.raises(ValueError, match="warps=x"):
        mod.plan(1, 4, 1, 128, 17, torch.device("cpu"))
    monkeypatch.setenv("DDTREE_TREE_ATTN", "bm=32,splits=3")
    cfg = mod.plan(1, 4, 1, 128, 17, torch.device("cpu"))
    assert (cfg["block_m"], cfg["heads"], cfg["splits"], cfg["row_blocks"]) == (32, 1, 3, 4)
    monkeypatch.delenv("DDTREE_TREE_ATTN")
    cfg = mod.plan(32, 32, 8, 128, 17, torch.device("cpu"))  # Qwen3-8B, b16: 4 heads x 17 rows in one tile
    assert (cfg["block_m"], cfg["block_n"], cfg["heads"], cfg["row_blocks"], cfg["splits"], cfg["warps"]) == (
        128, 32, 4, 1, 1, 8)
    cfg = mod.plan(1, 32, 8, 128, 65, torch.device("cpu"))  # b64: one head of 65 rows per tile
    assert (cfg["block_m"], cfg["heads"], cfg["row_blocks"]) == (128, 1, 4)
    cfg = mod.plan(1, 24, 4, 256, 17, torch.device("cpu"))  # Qwen3.6: 3 of its 6 heads x 17 rows per 64-row tile
    assert (cfg["block_m"], cfg["block_n"], cfg["heads"], cfg["row_blocks"], cfg["warps"]) == (64, 16, 3, 2, 8)
