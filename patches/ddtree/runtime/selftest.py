"""A small end-to-end check of the kernels against the references on one device.

Deployment probes call it on the host GPU to prove the vendored kernels compile and agree with the torch
references there (a broken triton / driver / arch shows up here rather than as wrong tokens in serving).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from ._dispatch import triton_available, use_triton


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu()))


def self_test(device: str | torch.device = "cuda", seed: int | None = None, batch: int = 3, depth: int = 5,
              vocab: int = 97, budget: int = 12) -> dict[str, Any]:
    """Run every step with impl="auto" and impl="torch" on random inputs; report per-step agreement.

    Returns ``{"ok", "device", "impl", "checks": {step: bool}, "errors": {step: str}, "seconds", "version"}``.
    ``impl`` is "triton" when the kernels ran, "torch" when the device resolves to the references only.
    """
    from ._version import __version__
    from .compaction import kv_compaction
    from .topk import draft_topk
    from .tree import build_tree
    from .verify import build_verify_inputs
    from .walk import accept_walk, sample_target_tokens

    dev = torch.device(device)
    t0 = time.perf_counter()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed if seed is not None else int(time.time_ns() % (1 << 31)))
    logits = torch.randn(batch, depth, vocab, generator=gen).to(dev)
    roots = torch.randint(0, vocab, (batch,), generator=gen).to(dev)
    committed = torch.randint(1, 100, (batch,), generator=gen).to(dev)
    checks: dict[str, bool] = {}
    errors: dict[str, str] = {}
    impl = "triton" if (triton_available() and use_triton("auto", logits)) else "torch"

    def step(name: str, fn):
        try:
            checks[name] = bool(fn())
        except Exception as exc:  # report, never raise: this runs inside a probe
            checks[name] = False
            errors[name] = f"{type(exc).__name__}: {exc}"

    k = min(budget, vocab)
    state: dict[str, Any] = {}

    def topk_check() -> bool:
        lp, tok = draft_topk(logits, k)
        lp_r, tok_r = draft_topk(logits, k, impl="torch")
        state["topk"] = (lp_r, tok_r)
        return _same(tok, tok_r) and bool(torch.allclose(lp.cpu(), lp_r.cpu(), atol=1e-5, rtol=0))

    def tree_check() -> bool:
        lp, tok = state["topk"]
        tree = build_tree(lp, tok, roots, budget)
        ref = build_tree(lp, tok, roots, budget, impl="torch")
        state["tree"] = ref
        return all(_same(getattr(tree, f), getattr(ref, f)) for f in
                   ("token", "parent", "depth", "score", "first_child", "next_sibling", "num_nodes"))

    def verify_check() -> bool:
        got = build_verify_inputs(state["tree"], committed)
        ref = build_verify_inputs(state["tree"], committed, impl="torch")
        return all(_same(getattr(got, f), getattr(ref, f)) for f in
                   ("positions", "mask", "packed_mask", "retrive_index", "retrive_next_token",
                    "retrive_next_sibling"))

    def walk_check() -> bool:
        tree = state["tree"]
        n1 = tree.parent.shape[1]
        target_logits = torch.randn(batch, n1, vocab, generator=gen).to(dev)
        # plant the drafted tokens so that the walk really descends
        target_logits.scatter_add_(2, tree.token.roll(-1, 1).unsqueeze(-1), torch.full((batch, n1, 1), 5.0, device=dev))
        tt = sample_target_tokens(target_logits, 0.0)
        ok = _same(tt, sample_target_tokens(target_logits, 0.0, impl="torch"))
        w = accept_walk(tree, tt)
        wr = accept_walk(tree, tt, impl="torch")
        ok = ok and all(_same(getattr(w, f), getattr(wr, f)) for f in
                        ("accepted_nodes", "accept_len", "accepted_tokens", "bonus_token"))
        slots = torch.randperm(batch * n1, generator=gen).view(batch, n1).to(dev)
        src, dst = kv_compaction(wr, slots)
        src_r, dst_r = kv_compaction(wr, slots, impl="torch")
        return ok and _same(src, src_r) and _same(dst, dst_r)

    step("draft_topk", topk_check)
    if "topk" in state:
        step("build_tree", tree_check)
    if "tree" in state:
        step("build_verify_inputs", verify_check)
        step("sample_walk_compaction", walk_check)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    ok = bool(checks) and all(checks.values()) and len(checks) == 4
    return {"ok": ok, "device": str(dev), "impl": impl, "checks": checks, "errors": errors,
            "seconds": round(time.perf_counter() - t0, 3), "version": __version__}
