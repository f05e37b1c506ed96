"""Model folders of production shapes for `--load-format dummy` runs (random weights, no checkpoint files).

Usage: python bench/e2e/mk_shapes.py OUTDIR BASEDIR   (BASEDIR = output of the bundle's mk_models.py: tokenizer)

q8b-target / q8b-dflash: Qwen3-8B (36 layers, hidden 4096, 32/8 heads, head_dim 128, intermediate 12288, vocab
151936) and the z-lab Qwen3-8B-DFlash-b16 drafter shape (5 layers at the target's width, block 16, target layers
[1, 9, 17, 25, 33], mask id 151669). The tiny tokenizer only lets the server start (runs pass token ids); the mask
token's name is one the tokenizer does not know, so the configured id is used as is.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_files import copy_tokenizer  # noqa: E402

QWEN3_8B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645,
                hidden_act="silu", attention_bias=False)
DRAFT_8B = dict(QWEN3_8B, architectures=["DFlashDraftModel"], num_hidden_layers=5, num_target_layers=36,
                layer_types=["full_attention"] * 5, block_size=16,
                dflash_config={"block_size": 16, "target_layer_ids": [1, 9, 17, 25, 33],
                               "mask_token": "<|dflash_mask|>", "mask_token_id": 151669})


def main() -> int:
    out, basedir = Path(sys.argv[1]), Path(sys.argv[2])
    for name, cfg in (("q8b-target", QWEN3_8B), ("q8b-dflash", DRAFT_8B)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        copy_tokenizer(basedir, d)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
    print("ok", *(str(out / n) for n in ("q8b-target", "q8b-dflash")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
