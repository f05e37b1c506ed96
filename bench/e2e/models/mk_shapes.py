"""Model folders of production shapes for `--load-format dummy` runs (random weights, no checkpoint files).

Usage: python -m bench.e2e.models.mk_shapes OUTDIR BASEDIR   (BASEDIR = output of mk_models: tokenizer)

q8b-target / q8b-dflash: Qwen3-8B (36 layers, hidden 4096, 32/8 heads, head_dim 128, intermediate 12288, vocab
151936) and the z-lab Qwen3-8B-DFlash-b16 drafter shape (5 layers at the target's width, block 16, target layers
[1, 9, 17, 25, 33], mask id 151669). The tiny tokenizer only lets the server start (runs pass token ids); the mask
token's name is one the tokenizer does not know, so the configured id is used as is.

q36-target / q36-dflash: Qwen3.6-27B as SGLang 0.5.17 serves it (`Qwen3_5ForConditionalGeneration`, model_type
qwen3_5: 64 layers = 16 x (3 GatedDeltaNet + 1 gated attention), hidden 5120, intermediate 17408, attention 24/4
heads of head_dim 256 with partial rotary 0.25, GatedDeltaNet 16 key / 48 value heads of 128, conv kernel 4, float32
SSM state, vocab 248320; the vision tower shrunk to one block, as only text is served) and the z-lab
Qwen3.6-27B-DFlash drafter shape (5 layers at hidden 5120, intermediate 17408, 32/8 heads of 128, layers
[sliding x4 (window 2048), full], block 16, target layers [1, 16, 31, 46, 61], mask id 248070).
transformers' Qwen3Config keeps `sliding_window` only with `use_sliding_window` true (it sets the window to None
otherwise, and SGLang's DFLASH drafter then refuses its sliding layers), so the drafter says so; `layer_types` is
given, so `max_window_layers` does not choose the layers.
"""
import json
import sys
from pathlib import Path

from bench.e2e.e2e_files import copy_tokenizer

QWEN3_8B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645,
                hidden_act="silu", attention_bias=False)
DRAFT_8B = dict(QWEN3_8B, architectures=["DFlashDraftModel"], num_hidden_layers=5, num_target_layers=36,
                layer_types=["full_attention"] * 5, block_size=16,
                dflash_config={"block_size": 16, "target_layer_ids": [1, 9, 17, 25, 33],
                               "mask_token": "<|dflash_mask|>", "mask_token_id": 151669})
QWEN36_TEXT = dict(model_type="qwen3_5_text", vocab_size=248320, hidden_size=5120, intermediate_size=17408,
                   num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                   linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                   linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                   layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
                   attn_output_gate=True, partial_rotary_factor=0.25, hidden_act="silu", rms_norm_eps=1e-6,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                    "mrope_interleaved": True, "mrope_section": [11, 11, 10]},
                   max_position_embeddings=262144, mamba_ssm_dtype="float32", mtp_num_hidden_layers=0,
                   tie_word_embeddings=False, eos_token_id=248044, torch_dtype="bfloat16", dtype="bfloat16")
QWEN36_27B = dict(architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5", text_config=QWEN36_TEXT,
                  vision_config=dict(depth=1, hidden_size=256, intermediate_size=512, num_heads=4, in_channels=3,
                                     patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                                     out_hidden_size=5120, num_position_embeddings=2304,
                                     deepstack_visual_indexes=[], hidden_act="gelu_pytorch_tanh"),
                  image_token_id=248056, video_token_id=248057, vision_start_token_id=248053,
                  vision_end_token_id=248054, tie_word_embeddings=False, torch_dtype="bfloat16")
DRAFT_36 = dict(architectures=["DFlashDraftModel"], model_type="qwen3", vocab_size=248320, hidden_size=5120,
                intermediate_size=17408, num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=262144, rope_theta=10000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False, torch_dtype="bfloat16", hidden_act="silu", attention_bias=False,
                num_target_layers=64, layer_types=["sliding_attention"] * 4 + ["full_attention"],
                use_sliding_window=True, sliding_window=2048, max_window_layers=5, block_size=16,
                dflash_config={"block_size": 16, "target_layer_ids": [1, 16, 31, 46, 61],
                               "mask_token": "<|dflash_mask|>", "mask_token_id": 248070})


def main() -> int:
    out, basedir = Path(sys.argv[1]), Path(sys.argv[2])
    for name, cfg in (("q8b-target", QWEN3_8B), ("q8b-dflash", DRAFT_8B), ("q36-target", QWEN36_27B),
                      ("q36-dflash", DRAFT_36)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        copy_tokenizer(basedir, d)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
    print("ok", *(str(out / n) for n in ("q8b-target", "q8b-dflash", "q36-target", "q36-dflash")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
