"""The verify metadata a mask-reading backend gets from a DDTree verify input, on the real patched SGLang, on CPU.

FlashInfer (wired, refused by default as not proven on a GPU here) plans TARGET_VERIFY from
`DFlashVerifyInput.generate_attn_arg_prefill`: query offsets of width N1, KV indices of each request's context
plus its N1 verify slots, and the flat custom mask, which for FlashInfer must mark the context columns visible
(`prefix_cols=True`). The triton backend's layout (tree block only) is covered by tests/runtime/test_mask.py and
was proven on the H200.
"""
from __future__ import annotations

from pathlib import Path

from v2_helpers import run_python

SCRIPT = r'''
import json, torch
from sglang.srt.speculative.ddtree import build_tree, build_verify_inputs, draft_topk, mask_numel, write_verify_mask
import sglang.srt.speculative.dflash_info as dflash_info
from sglang.srt.speculative.ddtree_v2.verify_input import DDTreeVerifyInput


class KvIndices:  # the base's KV-index Triton kernel does not run in Triton's CPU interpreter: its torch equivalent
    def __getitem__(self, grid):
        def run(req_to_token, pool, lens, indptr, start, out, stride):
            for b in range(grid[0]):
                out[int(indptr[b]): int(indptr[b + 1])] = req_to_token[int(pool[b]), : int(lens[b])]
        return run


dflash_info.create_flashinfer_kv_indices_triton = KvIndices()
g = torch.Generator().manual_seed(3)
bs, depth, vocab, budget = 3, 5, 40, 9
n1 = budget + 1
lp, tok = draft_topk(torch.randn(bs, depth, vocab, generator=g), budget, impl="torch")
tree = build_tree(lp, tok, torch.randint(0, vocab, (bs,), generator=g), budget, impl="torch")
prefix = torch.tensor([7, 0, 12])
vin = build_verify_inputs(tree, prefix, impl="torch")
mask = torch.zeros(mask_numel(int(prefix.sum()), bs, n1), dtype=torch.bool)
write_verify_mask(vin.mask, prefix, mask, prefix_cols=True, max_prefix=int(prefix.max()), impl="torch")
req_to_token = torch.arange(4 * 64, dtype=torch.int32).view(4, 64) + 1000
pool = torch.tensor([2, 0, 3])
spec = DDTreeVerifyInput(draft_token=tree.token.reshape(-1), positions=vin.positions.reshape(-1),
                         draft_token_num=n1, custom_mask=mask, tree=tree)
kv_indices, kv_indptr, qo_indptr, got_mask = spec.generate_attn_arg_prefill(pool, prefix, int(prefix.sum()),
                                                                            req_to_token)
rows = []
for b in range(bs):
    p = int(prefix[b])
    block = got_mask[int(sum(n1 * (int(prefix[c]) + n1) for c in range(b))):][: n1 * (p + n1)].view(n1, p + n1)
    rows.append({"context_visible": bool(block[:, :p].all()), "tree_equal": bool(torch.equal(block[:, p:], vin.mask[b]))})
print("RESULT" + json.dumps({
    "qo_indptr": qo_indptr.tolist(), "kv_indptr": kv_indptr.tolist(),
    "kv_indices": kv_indices.tolist(), "rows": rows, "mask_numel": got_mask.numel(),
    "expect_kv": [int(x) for b in range(bs) for x in req_to_token[int(pool[b]), : int(prefix[b]) + n1]],
}))
'''


def test_flashinfer_verify_metadata_and_mask(v2_tree: Path, tmp_path: Path):
    import json

    r = run_python(v2_tree, tmp_path, SCRIPT)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    got = json.loads(line[len("RESULT"):])
    n1, prefix = 10, [7, 0, 12]
    assert got["qo_indptr"] == [0, n1, 2 * n1, 3 * n1], "one query per tree node, N1 per request"
    assert got["kv_indptr"] == [0, 7 + n1, 7 + n1 + n1, 7 + n1 + n1 + 12 + n1]
    assert got["kv_indices"] == got["expect_kv"], "each request's context slots, then its N1 verify slots"
    assert got["mask_numel"] == n1 * (sum(prefix) + 3 * n1)
    assert all(r["context_visible"] and r["tree_equal"] for r in got["rows"]), got["rows"]
