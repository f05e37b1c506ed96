"""A tiny Qwen3 target whose greedy continuation is a known cycle, and a DFlash drafter that half-agrees with it.

Usage: python -m bench.e2e.models.mk_agree OUTDIR BASEDIR [HEAD_DIM]   (BASEDIR = output of mk_models, for the tokenizer)
HEAD_DIM (default 16) other than 16 writes agree-qwen3-hdN / agree-dflash-hdN: the same models with attention heads of
N (FlashInfer's kernels take head dims 64, 128 and 256, not 16). The attention output never reaches the residual
stream (o_proj is zero), so every head dim decodes the same tokens.

Why this shape (cheap, and every number it produces is checkable):
- Target: every layer's o_proj and down_proj are zero, so the residual stream is the token embedding and the
  logits depend on the current token only: logits(t) = W_lm . rmsnorm(E[t]). The embeddings of the cycle tokens
  C0..C3 are orthogonal axes e0..e3 and W_lm[C(i+1)] reads axis i, so greedy decoding after any cycle token
  walks C0 -> C1 -> C2 -> C3 -> C0 ...; every other token reads axis 5, which W_lm[C0] also reads, so any prompt
  enters the cycle at C0.
- Drafter (DFlash, 1 layer, block size 8, same zero-residual construction): its output at every masked position
  is rmsnorm(E[mask]), and E[mask] = 1.0 e0 + 0.9 e1 + 0.8 e2 + 0.7 e3. Through the target's lm_head that ranks
  C1 > C2 > C3 > C0 at *every* depth, with log-probs about -0.5, -1.4, -2.4, -3.3 and the other 508 tokens near
  -9.8. The right token is always among the drafter's top 4, but its top-1 is right only after C0.
  A DFlash chain (top-1 at every depth) therefore accepts ~0.25 drafts per round; a DDTree tree that spends its
  budget on the top-4 branches accepts more, and more with a larger budget (up to depth 7).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from bench.e2e.e2e_files import copy_tokenizer
from bench.e2e.workloads import CYCLE

def main(argv: list[str]) -> int:
    """Write OUTDIR/agree-qwen3 and OUTDIR/agree-dflash and print the self-check (greedy cycle, draft top-5)."""
    out, basedir = argv[0], argv[1]
    Dh = int(argv[2]) if len(argv) > 2 else 16
    suffix = "" if Dh == 16 else f"-hd{Dh}"
    tgt, drf = os.path.join(out, "agree-qwen3" + suffix), os.path.join(out, "agree-dflash" + suffix)
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(drf, exist_ok=True)
    copy_tokenizer(basedir, tgt, drf)
    torch.manual_seed(1)
    V, H, INTER, L_T = 512, 64, 128, 4
    MASK_ID = json.load(open(os.path.join(basedir, "tiny-dflash", "config.json")))["dflash_config"]["mask_token_id"]
    EOS = 0
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=INTER, num_hidden_layers=L_T, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=Dh, max_position_embeddings=4096, tie_word_embeddings=False,
                      eos_token_id=EOS, bos_token_id=EOS, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg)
    sd = model.state_dict()
    E = torch.zeros(V, H)
    E[:, 6:] = torch.randn(V, H - 6) * 0.05
    E[:, 5] = 4.0
    for i, t in enumerate(CYCLE):
        E[t] = 0.0
        E[t, i] = 4.0
    E[MASK_ID] = 0.0
    E[MASK_ID, :4] = 4.0 * torch.tensor([1.0, 0.9, 0.8, 0.7])
    W = torch.randn(V, H) * 0.02
    W[:, :6] = 0.0
    for i in range(4):
        W[CYCLE[(i + 1) % 4], i] = 2.0
    W[CYCLE[0], 5] = 2.0
    W[EOS] = 0.0  # never emit EOS
    with torch.no_grad():
        for k in sd:
            if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
                sd[k].zero_()
        sd["model.embed_tokens.weight"].copy_(E)
        sd["lm_head.weight"].copy_(W)
    model.load_state_dict(sd)
    model.to(torch.bfloat16).save_pretrained(tgt, safe_serialization=True)

    d = cfg.to_dict()
    BS = 8
    d.update(architectures=["DFlashDraftModel"], num_hidden_layers=1, layer_types=["full_attention"], num_target_layers=L_T,
             block_size=BS, dflash_config={"block_size": BS, "target_layer_ids": [0, 2], "mask_token": "<|mask|>",
                                           "mask_token_id": MASK_ID})
    json.dump(d, open(os.path.join(drf, "config.json"), "w"), indent=1)
    nq, nkv, K = 4, 2, 2
    def r(*s):
        return (torch.randn(*s) * 0.02).to(torch.bfloat16)


    def z(*s):
        return torch.zeros(*s, dtype=torch.bfloat16)


    def one(n):
        return torch.ones(n, dtype=torch.bfloat16)



    w = {"layers.0.self_attn.q_proj.weight": r(nq * Dh, H), "layers.0.self_attn.k_proj.weight": r(nkv * Dh, H),
         "layers.0.self_attn.v_proj.weight": r(nkv * Dh, H), "layers.0.self_attn.o_proj.weight": z(H, nq * Dh),
         "layers.0.self_attn.q_norm.weight": one(Dh), "layers.0.self_attn.k_norm.weight": one(Dh),
         "layers.0.mlp.gate_proj.weight": r(INTER, H), "layers.0.mlp.up_proj.weight": r(INTER, H), "layers.0.mlp.down_proj.weight": z(H, INTER),
         "layers.0.input_layernorm.weight": one(H), "layers.0.post_attention_layernorm.weight": one(H),
         "norm.weight": one(H), "fc.weight": r(H, K * H), "hidden_norm.weight": one(H)}
    save_file(w, os.path.join(drf, "model.safetensors"), metadata={"format": "pt"})

    # Self-check in plain torch: the target's greedy continuation is the cycle, and the drafter's ranking is as claimed.
    m = Qwen3ForCausalLM.from_pretrained(tgt, torch_dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42]])
    with torch.no_grad():
        for _ in range(8):
            ids = torch.cat([ids, m(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    got = ids[0, 3:].tolist()
    assert got == [CYCLE[i % 4] for i in range(8)], got
    h = E[MASK_ID] / E[MASK_ID].pow(2).mean().add(1e-6).sqrt()
    lp = torch.log_softmax(W @ h, -1)
    top = lp.topk(5)
    print("ok", tgt, drf, "mask", MASK_ID, "greedy", got, "draft top5", top.indices.tolist(), [round(x, 2) for x in top.values.tolist()])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
