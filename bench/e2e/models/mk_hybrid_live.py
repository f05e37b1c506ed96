"""A tiny hybrid Qwen3-Next target whose next token is one of a few "live" tokens chosen by its context, and a
DFlash drafter whose top-k covers exactly those tokens.

Usage: python -m bench.e2e.models.mk_hybrid_live OUTDIR BASEDIR   (BASEDIR = output of mk_models, for the tokenizer)

Why this shape (issue #9's proof needs DDTree to accept *branches* on a recurrent model, and a wrong recurrent state
to change the output):
- Architecture as mk_hybrid.py (3 GatedDeltaNet layers + 1 attention layer, MoE with 4 experts,
  hidden 128), so it runs through SGLang's Qwen3-Next model, GDN backend and tree-verify kernels.
- Hidden axis 0 is a constant "bias" axis: every token embedding has E[t, 0] = A and every projection that writes
  into the residual stream (attention o_proj, GDN out_proj, MoE down projections) has a zero row 0, so the final
  hidden state keeps a positive axis 0 whatever the context. The LM head rows of all tokens except LIVE read
  axis 0 with a large negative weight (they can never win); the LIVE rows read only axes 1.. with large random
  weights. So the target always emits a LIVE token, and which one is decided by the residual stream's other axes.
- The GDN layers' output projections are scaled up so that their contribution to those axes is as large as the
  token embedding's: the recurrent state (i.e. the whole history) decides the next token. The self-check below
  measures it: with the GDN layers' outputs zeroed, most greedy choices change.
- Drafter: the DFlash drafter shares the target's embedding and LM head; the mask token's embedding is the bias
  axis alone, and the drafter's own layers write little, so at every depth its top-|LIVE| are the LIVE tokens with
  near-equal log-probs (~ -log |LIVE|). A chain (top-1) is right about 1/|LIVE| of the time; a DDTree of budget
  >= |LIVE| always contains the target's depth-1 token and, with larger budgets, many depth-2 pairs: it accepts
  deep nodes whose parents are not node 0's first child, which is what exercises per-node state and its commit.
- Logit gaps: only 4 LIVE tokens, spread widely (median top-2 gap ~3.3 in the self-check), so near-ties are rare.
  (They still exist, and SGLang 0.5.11's plain GDN decode rounds beta to bf16 where its verify kernel does not, so
  the stock chain can differ from plain decoding here; see bench/results/e2e-hybrid.md and the `arv` baseline.)
"""
from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from bench.e2e.e2e_files import copy_tokenizer

LIVE = list(range(100, 104))  # the tokens the target can emit (few: wide relative logit gaps)
A = 4.0  # bias axis value of every embedding
# GatedDeltaNet out_proj init (std 0.02) times this: the layers' residual contribution (std ~0.02 at init) becomes
# ~1.5, as large as the token embedding's, so the history decides the next token.
GDN_OUT_SCALE = 800.0
LIVE_STD = 0.6  # LM head weight std of the LIVE rows (axes 1..)
DEAD = -20.0  # LM head weight of all other rows on the bias axis


def build(out: str, basedir: str) -> tuple[str, str]:
    tgt, drf = os.path.join(out, "live-next"), os.path.join(out, "live-next-dflash")
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(drf, exist_ok=True)
    copy_tokenizer(basedir, tgt, drf)
    mask_id = json.load(open(os.path.join(basedir, "tiny-dflash", "config.json")))["dflash_config"]["mask_token_id"]
    eos = 0
    torch.manual_seed(7)
    V, H = 512, 128
    cfg = Qwen3NextConfig(vocab_size=V, hidden_size=H, intermediate_size=256, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
                          linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
                          linear_num_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=64,
                          shared_expert_intermediate_size=64, num_experts_per_tok=2, num_experts=4,
                          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                          max_position_embeddings=4096, eos_token_id=eos, bos_token_id=eos, tie_word_embeddings=False,
                          torch_dtype="bfloat16")
    model = Qwen3NextForCausalLM(cfg)
    sd = model.state_dict()
    E = torch.randn(V, H)
    E[:, 0] = A
    E[mask_id] = 0.0
    E[mask_id, 0] = A
    W = torch.zeros(V, H)
    W[:, 0] = DEAD
    for t in LIVE:
        W[t, 0] = 0.0
        W[t, 1:] = torch.randn(H - 1) * LIVE_STD
    with torch.no_grad():
        for k, v in sd.items():
            if k.endswith("linear_attn.out_proj.weight"):
                v.mul_(GDN_OUT_SCALE)
            if k.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")) or ".experts.down_proj" in k:
                if v.dim() == 2:
                    v[0].zero_()  # row 0 writes the bias axis
                elif v.dim() == 3:  # fused experts [E, H, I] or [E, I, H]: zero whatever indexes the hidden axis
                    if v.shape[1] == H:
                        v[:, 0].zero_()
                    else:
                        v[..., 0].zero_()
        sd["model.embed_tokens.weight"].copy_(E)
        sd["lm_head.weight"].copy_(W)
    model.load_state_dict(sd)
    model.to(torch.bfloat16).save_pretrained(tgt, safe_serialization=True)
    c = json.load(open(os.path.join(tgt, "config.json")))
    c["full_attention_interval"] = 4  # SGLang's own Qwen3-Next config class reads it
    json.dump(c, open(os.path.join(tgt, "config.json"), "w"), indent=1)

    d = json.load(open(os.path.join(basedir, "tiny-dflash", "config.json")))
    Dh, nq, nkv, K, inter = 32, 4, 2, 2, 256
    d.update(hidden_size=H, intermediate_size=inter, head_dim=Dh, num_attention_heads=nq, num_key_value_heads=nkv,
             num_target_layers=4, vocab_size=V,
             dflash_config={"block_size": 4, "target_layer_ids": [0, 2], "mask_token": "<|mask|>",
                            "mask_token_id": mask_id})
    json.dump(d, open(os.path.join(drf, "config.json"), "w"), indent=1)

    def r(*s, std=0.02):
        return (torch.randn(*s) * std).to(torch.bfloat16)

    def one(n):
        return torch.ones(n, dtype=torch.bfloat16)

    w = {"layers.0.self_attn.q_proj.weight": r(nq * Dh, H), "layers.0.self_attn.k_proj.weight": r(nkv * Dh, H),
         "layers.0.self_attn.v_proj.weight": r(nkv * Dh, H), "layers.0.self_attn.o_proj.weight": r(H, nq * Dh),
         "layers.0.self_attn.q_norm.weight": one(Dh), "layers.0.self_attn.k_norm.weight": one(Dh),
         "layers.0.mlp.gate_proj.weight": r(inter, H), "layers.0.mlp.up_proj.weight": r(inter, H),
         "layers.0.mlp.down_proj.weight": r(H, inter), "layers.0.input_layernorm.weight": one(H),
         "layers.0.post_attention_layernorm.weight": one(H), "norm.weight": one(H), "fc.weight": r(H, K * H),
         "hidden_norm.weight": one(H)}
    save_file(w, os.path.join(drf, "model.safetensors"), metadata={"format": "pt"})
    return tgt, drf


def self_check(tgt: str) -> dict:
    """Plain-torch facts about the target: it emits only LIVE tokens, with wide gaps, and its history matters."""
    m = Qwen3NextForCausalLM.from_pretrained(tgt, torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 400, (int(torch.randint(4, 24, (1,), generator=g)),), generator=g) for _ in range(6)]
    outs, gaps, changed, total = [], [], 0, 0
    with torch.no_grad():
        for p in prompts:
            ids = p.unsqueeze(0)
            for _ in range(12):
                logits = m(ids).logits[0, -1]
                top = logits.topk(2)
                gaps.append(float(top.values[0] - top.values[1]))
                ids = torch.cat([ids, top.indices[:1].view(1, 1)], 1)
            outs.append(ids[0, len(p):].tolist())
        # History sensitivity: same sequences with the GDN layers' outputs removed.
        saved = {}
        for name, mod in m.named_modules():
            if name.endswith("linear_attn.out_proj"):
                saved[name] = mod.weight.detach().clone()
                mod.weight.zero_()
        for p, o in zip(prompts, outs, strict=True):
            ids = torch.cat([p, torch.tensor(o)]).unsqueeze(0)
            logits = m(ids).logits[0, len(p) - 1:-1]
            changed += int((logits.argmax(-1) != torch.tensor(o)).sum())
            total += len(o)
        for name, mod in m.named_modules():
            if name in saved:
                mod.weight.copy_(saved[name])
    flat = [t for o in outs for t in o]
    facts = {"all_live": all(t in LIVE for t in flat), "distinct_tokens": sorted(set(flat)),
             "min_top2_gap": round(min(gaps), 4), "median_top2_gap": round(sorted(gaps)[len(gaps) // 2], 4),
             "greedy_changed_without_gdn": f"{changed}/{total}", "sample": outs[0]}
    assert facts["all_live"], facts
    assert changed >= total // 3, facts  # the recurrent layers decide a good share of the tokens
    return facts


if __name__ == "__main__":
    t, d = build(sys.argv[1], sys.argv[2])
    print("ok", t, d, json.dumps(self_check(t)))
