"""The `rand` model set and the tokenizer every model maker reuses: a tiny random Qwen3 target, a tiny random DFlash
drafter and a local byte-level BPE tokenizer (no network).

Usage: python -m bench.e2e.models.mk_models OUTDIR [HEAD_DIM]   (writes OUTDIR/tiny-qwen3 and OUTDIR/tiny-dflash; default: models;
       a HEAD_DIM other than 16 writes tiny-qwen3-hdN and tiny-dflash-hdN, the same shapes with attention heads of N)

Target: Qwen3, 4 layers, hidden 64, vocabulary 512 (the tokenizer's 400 padded), bfloat16, random weights (seed 0).
Drafter: DFlash, 1 layer, block size 4, reading the hidden states of target layers [0, 2] (the target captures the
input of layer id + 1, so the ids must be below its last layer). The other makers (mk_agree, mk_big, mk_shapes,
mk_profile, mk_hybrid, mk_hybrid_live) copy the tokenizer of OUTDIR/tiny-qwen3.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def draft_weights(H: int, I: int, Dh: int, nq: int, nkv: int, K: int) -> dict[str, torch.Tensor]:  # noqa: E741
    """A random 1-layer DFlash drafter's weights (bfloat16, N(0, 0.02) drawn from torch's global generator in this
    order): hidden H, MLP I, head dim Dh, nq query / nkv key-value heads, fc over K target layers."""
    def r(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    def one(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    return {"layers.0.self_attn.q_proj.weight": r(nq * Dh, H), "layers.0.self_attn.k_proj.weight": r(nkv * Dh, H),
            "layers.0.self_attn.v_proj.weight": r(nkv * Dh, H), "layers.0.self_attn.o_proj.weight": r(H, nq * Dh),
            "layers.0.self_attn.q_norm.weight": one(Dh), "layers.0.self_attn.k_norm.weight": one(Dh),
            "layers.0.mlp.gate_proj.weight": r(I, H), "layers.0.mlp.up_proj.weight": r(I, H),
            "layers.0.mlp.down_proj.weight": r(H, I),
            "layers.0.input_layernorm.weight": one(H), "layers.0.post_attention_layernorm.weight": one(H),
            "norm.weight": one(H), "fc.weight": r(H, K * H), "hidden_norm.weight": one(H)}


def main(argv: list[str]) -> int:
    out = argv[0] if argv else "models"
    head_dim = int(argv[1]) if len(argv) > 1 else 16  # other than 16: tiny-qwen3-hdN / tiny-dflash-hdN (FlashInfer)
    suffix = "" if head_dim == 16 else f"-hd{head_dim}"
    tgt, drf = os.path.join(out, "tiny-qwen3" + suffix), os.path.join(out, "tiny-dflash" + suffix)
    os.makedirs(tgt, exist_ok=True)
    os.makedirs(drf, exist_ok=True)
    torch.manual_seed(0)
    # tokenizer: byte-level BPE trained on a small synthetic corpus
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = (["the quick brown fox jumps over the lazy dog %d" % i for i in range(200)]
              + ["hello world, this is a tiny model."] * 50)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   mask_token="<|mask|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tgt)
    fast.save_pretrained(drf)
    vocab = 512  # padded
    mask_id = fast.convert_tokens_to_ids("<|mask|>")
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                      tie_word_embeddings=False, eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id,
                      torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tgt, safe_serialization=True)
    # draft: 1 layer, reads hidden states of target layers [0, 2] (the target captures the input of layer id+1)
    d = cfg.to_dict()
    d.update(architectures=["DFlashDraftModel"], num_hidden_layers=1, layer_types=["full_attention"],
             num_target_layers=4, block_size=4,
             dflash_config={"block_size": 4, "target_layer_ids": [0, 2], "mask_token": "<|mask|>",
                            "mask_token_id": mask_id})
    with open(os.path.join(drf, "config.json"), "w") as fh:
        json.dump(d, fh, indent=1)
    w = draft_weights(H=64, I=128, Dh=head_dim, nq=4, nkv=2, K=2)
    save_file(w, os.path.join(drf, "model.safetensors"), metadata={"format": "pt"})
    print("ok", tgt, drf, "mask_id", mask_id, sorted(os.listdir(tgt)), sorted(os.listdir(drf)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
