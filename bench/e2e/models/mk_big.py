"""A larger random Qwen3 target (hidden 1024, 8 layers) and a random DFlash drafter for it: the `big` model set.

Usage: python -m bench.e2e.models.mk_big OUTDIR [BASEDIR] [--check] [--beta B] [--lm-std S] [--seed N]
  BASEDIR (default OUTDIR) holds tiny-qwen3/ from mk_models, whose tokenizer is reused.
  Writes OUTDIR/big-qwen3 and OUTDIR/big-dflash (bf16 safetensors). Idempotent: an existing pair with the same
  parameters is kept. --check (CPU, ~1 min) prints near-tie statistics of the greedy workload (see below).

Why this shape:
- Random weights, as the `rand` pair, but hidden 1024 / intermediate 3072 / 8 layers: real-sized GEMMs and
  attention sums, the drafter reading target layers [1, 5] (the target captures the input of layer id + 1, so the
  ids must be below the last layer), block size 4. head_dim 32 keeps SGLang 0.5.11 off its JIT QK-norm kernel
  (compiled with nvcc at first use for head_dim 64/128/...), so start-up costs no compilation.
- The point of the set is greedy DDTree == AR at batch 4/16, which the tiny `rand` pair misses at bf16 near-ties
  (the stock DFlash chain misses them too; e2e-summary.md). Scaling the LM head alone does not help: bf16 rounding
  is relative, so a uniformly larger init scales the gaps and the rounding error alike. Measured with --check on
  the CPU over the 768 greedy steps: the share of steps whose top-2 fp32 logits lie within 1 % of the top logit is
  8.3 % at LM-head std 0.02 and 8.6 % at 0.1. What lowers it is fewer, better separated competitors: the LM-head
  rows get a log-normal norm spread (row v scaled by exp(beta * u_v), u_v ~ N(0, 1), beta 1.0), like the frequent
  tokens of a trained model: 1.8 % of the steps (0.5 % within 0.4 %, about one bf16 ulp), while the argmax still
  moves with the context (31 distinct tokens in the 768 steps; 201 without the spread). The CPU decode-vs-prefill
  stand-in diverges on 5 of 16 requests instead of 11 (std 0.02) and 9 (std 0.1). The larger hidden size should
  also average a kernel's last-bit differences over more components. Near-ties become rarer, not impossible: a
  divergence must still be checked against its fp32 gap (`python -m bench.e2e.report sweep` does). The base std is 0.05 (a peaked
  softmax); the EOS row is zero so requests run to length.
- Side effect used by the acceptance numbers: the drafter shares the target's LM head, so both favour the same
  high-norm rows; a random drafter's top-k then holds the target's next token well above 1/vocab, more for wider
  trees, so DDTree accepts some nodes (the `rand` pair accepts ~nothing) and the walk/compaction paths run.
- Weights are drawn from a seeded torch.Generator in a fixed order and written directly (no transformers init), so
  the same arguments give bit-identical files on any machine: the post-processing rebuilds them to explain a
  divergence (`python -m bench.e2e.report sweep`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.e2e.e2e_files import copy_tokenizer

V, H, INTER, LAYERS, NQ, NKV, DH = 512, 1024, 3072, 8, 32, 8, 32
BLOCK, TARGET_LAYER_IDS = 4, [1, 5]
BASE_STD = 0.02


def _layer_shapes(prefix: str, i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"{prefix}layers.{i}."
    return [(p + "self_attn.q_proj.weight", (NQ * DH, H)), (p + "self_attn.k_proj.weight", (NKV * DH, H)),
            (p + "self_attn.v_proj.weight", (NKV * DH, H)), (p + "self_attn.o_proj.weight", (H, NQ * DH)),
            (p + "self_attn.q_norm.weight", (DH,)), (p + "self_attn.k_norm.weight", (DH,)),
            (p + "mlp.gate_proj.weight", (INTER, H)), (p + "mlp.up_proj.weight", (INTER, H)),
            (p + "mlp.down_proj.weight", (H, INTER)), (p + "input_layernorm.weight", (H,)),
            (p + "post_attention_layernorm.weight", (H,))]


def _fill(shapes: list[tuple[str, tuple[int, ...]]], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Norm weights 1, everything else N(0, 0.02), in the listed order (the order is part of the seed)."""
    out = {}
    for name, shape in shapes:
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            out[name] = (torch.randn(shape, generator=gen) * BASE_STD).to(torch.bfloat16)
    return out


def target_config(eos: int) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": None,
            "dtype": "bfloat16", "head_dim": DH, "hidden_act": "silu", "hidden_size": H, "initializer_range": BASE_STD,
            "intermediate_size": INTER, "layer_types": ["full_attention"] * LAYERS, "max_position_embeddings": 4096,
            "max_window_layers": 28, "num_attention_heads": NQ, "num_hidden_layers": LAYERS,
            "num_key_value_heads": NKV, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": None,
            "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False, "vocab_size": V}


def build(out: Path, basedir: Path, *, beta: float, lm_std: float, seed: int) -> dict:
    tgt, drf = out / "big-qwen3", out / "big-dflash"
    params = {"beta": beta, "lm_std": lm_std, "seed": seed, "hidden": H, "layers": LAYERS, "block": BLOCK,
              "target_layer_ids": TARGET_LAYER_IDS}
    stamp = tgt / "mk_big.json"
    if stamp.exists() and (drf / "model.safetensors").exists():
        old = json.loads(stamp.read_text())
        if old.get("params") == params:
            return old
    tgt.mkdir(parents=True, exist_ok=True)
    drf.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(basedir, tgt, drf)
    tiny_draft = json.loads((basedir / "tiny-dflash" / "config.json").read_text())
    mask_id = tiny_draft["dflash_config"]["mask_token_id"]
    eos = json.loads((basedir / "tiny-qwen3" / "config.json").read_text())["eos_token_id"]

    gen = torch.Generator().manual_seed(seed)
    shapes = [("model.embed_tokens.weight", (V, H))]
    for i in range(LAYERS):
        shapes += _layer_shapes("model.", i)
    shapes.append(("model.norm.weight", (H,)))
    w = _fill(shapes, gen)
    row_scale = torch.exp(beta * torch.randn(V, generator=gen))
    row_scale = row_scale / row_scale.mean()
    lm = torch.randn(V, H, generator=gen) * lm_std * row_scale[:, None]
    lm[eos] = 0.0  # never emit EOS: every request runs to max_new_tokens
    w["lm_head.weight"] = lm.to(torch.bfloat16)
    save_file(w, str(tgt / "model.safetensors"), metadata={"format": "pt"})
    cfg = target_config(eos)
    (tgt / "config.json").write_text(json.dumps(cfg, indent=1))
    (tgt / "generation_config.json").write_text(json.dumps({"bos_token_id": eos, "eos_token_id": eos}))

    d = dict(cfg)
    d.update(architectures=["DFlashDraftModel"], num_hidden_layers=1, layer_types=["full_attention"],
             num_target_layers=LAYERS, block_size=BLOCK,
             dflash_config={"block_size": BLOCK, "target_layer_ids": TARGET_LAYER_IDS, "mask_token": "<|mask|>",
                            "mask_token_id": mask_id})
    (drf / "config.json").write_text(json.dumps(d, indent=1))
    dshapes = _layer_shapes("", 0) + [("norm.weight", (H,)), ("fc.weight", (H, len(TARGET_LAYER_IDS) * H)),
                                      ("hidden_norm.weight", (H,))]
    save_file(_fill(dshapes, gen), str(drf / "model.safetensors"), metadata={"format": "pt"})

    digest = hashlib.sha256()
    for p in (tgt / "model.safetensors", drf / "model.safetensors"):
        digest.update(p.read_bytes())
    rec = {"params": params, "sha256": digest.hexdigest(), "target": str(tgt), "draft": str(drf), "mask_id": mask_id,
           "eos": eos}
    stamp.write_text(json.dumps(rec, indent=1))
    return rec


def check(tgt: Path, n_prompts: int = 16, max_new: int = 48) -> dict:
    """Greedy workload of the driver on the CPU: how close to a tie is the argmax at each step?

    bf16 incremental decoding (as the AR baseline) gives the trajectory; one teacher-forced forward over it in fp32
    gives each step's top-2 logits. Reported: the share of steps whose gap is under 1 % / 0.4 % (about one bf16 ulp)
    of the top logit, the smallest gap, and the distinct tokens emitted (the argmax must move with the context).
    `cpu_decode_vs_prefill_diverged` compares the bf16 trajectory with a bf16 teacher-forced forward: a CPU stand-in
    for decode-vs-verify kernels, much noisier than the GPU's (its CPU kernels differ in more than summation order).
    """
    from transformers import Qwen3ForCausalLM

    from bench.e2e.workloads import prompts

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    m16 = Qwen3ForCausalLM.from_pretrained(str(tgt), dtype=torch.bfloat16).eval()
    m32 = Qwen3ForCausalLM.from_pretrained(str(tgt), dtype=torch.float32).eval()
    rel_gaps, tokens, diverged = [], set(), 0
    with torch.no_grad():
        for p in prompts(n_prompts):
            o = m16(input_ids=torch.tensor([p]), use_cache=True)
            past, out = o.past_key_values, []
            for _ in range(max_new):
                nt = int(o.logits[0, -1].float().argmax())
                out.append(nt)
                o = m16(input_ids=torch.tensor([[nt]]), past_key_values=past, use_cache=True)
                past = o.past_key_values
            full = torch.tensor([p + out[:-1]])
            lg32 = m32(input_ids=full).logits[0, len(p) - 1:]
            top = lg32.topk(2, -1).values
            rel_gaps += ((top[:, 0] - top[:, 1]) / top[:, 0].abs()).tolist()
            lg16 = m16(input_ids=full).logits[0, len(p) - 1:].float()
            diverged += lg16.argmax(-1).tolist() != out
            tokens.update(out)
    g = torch.tensor(rel_gaps)
    return {"steps": len(rel_gaps), "share_rel_gap_lt_1pct": round(float((g < 0.01).float().mean()), 4),
            "share_rel_gap_lt_0p4pct": round(float((g < 0.004).float().mean()), 4),
            "min_rel_gap": round(float(g.min()), 6), "distinct_tokens": len(tokens),
            "cpu_decode_vs_prefill_diverged": f"{diverged}/{n_prompts}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("basedir", type=Path, nargs="?")
    ap.add_argument("--beta", type=float, default=1.0, help="log-normal spread of the LM-head row norms")
    ap.add_argument("--lm-std", type=float, default=0.05, help="LM-head base std")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="CPU near-tie statistics of the greedy workload")
    a = ap.parse_args()
    rec = build(a.outdir, a.basedir or a.outdir, beta=a.beta, lm_std=a.lm_std, seed=a.seed)
    if a.check:
        rec["check"] = check(Path(rec["target"]))
    print("ok", json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
