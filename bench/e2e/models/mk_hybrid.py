"""The `hyb` model set: a tiny random Qwen3-Next target (GatedDeltaNet + attention, MoE) and a DFlash drafter for it.

Usage: python -m bench.e2e.models.mk_hybrid OUTDIR BASEDIR   (BASEDIR = output of mk_models: its tokenizer and its
drafter's config are reused; writes OUTDIR/tiny-next and OUTDIR/tiny-next-dflash)

Target: 3 GatedDeltaNet layers + 1 attention layer, 4 experts, hidden 128, random weights (seed 0);
`full_attention_interval` 4 is added to its config.json, which SGLang's own config class needs. Drafter: DFlash,
1 layer, block size 4, target layers [0, 2].
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, Qwen3NextConfig, Qwen3NextForCausalLM

from bench.e2e.models.mk_models import draft_weights


def main(argv: list[str]) -> int:
    out, base = argv[0], argv[1]  # base: the folder mk_models made (tokenizer reused)
    tok = AutoTokenizer.from_pretrained(os.path.join(base, "tiny-qwen3"))
    tgt, drf = os.path.join(out, "tiny-next"), os.path.join(out, "tiny-next-dflash")
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(drf, exist_ok=True)
    tok.save_pretrained(tgt)
    tok.save_pretrained(drf)
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
                          linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
                          linear_num_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=64,
                          shared_expert_intermediate_size=64, num_experts_per_tok=2, num_experts=4,
                          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                          max_position_embeddings=4096, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                          torch_dtype="bfloat16")
    m = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(tgt, safe_serialization=True)
    with open(os.path.join(tgt, "config.json")) as fh:
        c = json.load(fh)
    c["full_attention_interval"] = 4
    with open(os.path.join(tgt, "config.json"), "w") as fh:
        json.dump(c, fh, indent=1)
    mask_id = tok.convert_tokens_to_ids("<|mask|>")
    with open(os.path.join(base, "tiny-dflash", "config.json")) as fh:
        d = json.load(fh)
    H, I, Dh, nq, nkv, K = 128, 256, 32, 4, 2, 2  # noqa: E741 (the layer shapes' usual letters)
    d.update(hidden_size=H, intermediate_size=I, head_dim=Dh, num_attention_heads=nq, num_key_value_heads=nkv,
             num_target_layers=4,
             dflash_config={"block_size": 4, "target_layer_ids": [0, 2], "mask_token": "<|mask|>",
                            "mask_token_id": mask_id})
    with open(os.path.join(drf, "config.json"), "w") as fh:
        json.dump(d, fh, indent=1)
    w = draft_weights(H=H, I=I, Dh=Dh, nq=nq, nkv=nkv, K=K)
    save_file(w, os.path.join(drf, "model.safetensors"), metadata={"format": "pt"})
    print("ok", tgt, drf)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
