"""Benchmark-only start-up hook (bench/e2e, never shipped): the `prof` models' controlled weights.

`bench/e2e/driver.py` puts this directory first on PYTHONPATH for the `prof` model set and sets E2E_PROFILE_JSON to the
profile that `models/mk_profile.py` wrote. Every process of that Engine imports this file at start-up; when SGLang's
model loader module is executed, its `initialize_dummy_weights` (the `--load-format dummy` fill) is wrapped so
that, right after the random fill, the model gets the profile's weights (models/mk_profile.py says why these):
- `o_proj` and `down_proj` of every layer, and a GatedDeltaNet layer's `out_proj`: zero (the GEMMs and the
  recurrence still run at full size);
- every norm: scale one (weight one; a Gemma-style norm, which scales by 1 + weight, weight zero);
- the token embedding: every row e0 (the drafter has none; it reads the target's);
- the LM head: column 0 holds the profile's bf16 weights for its tokens and `lm_head_col0_other` for every other
  token; all other columns zero.
Nothing else is touched, and nothing happens without E2E_PROFILE_JSON.
"""
import json
import os
import sys

_TARGET = "sglang.srt.model_loader.loader"


def apply_profile(model, profile: dict) -> list:
    """Overwrite the tensors named above in place; returns the names it set (logged by the caller)."""
    import torch

    done = []
    gemma = set()  # norms that scale by 1 + weight (Qwen3.5 / 3.6): weight zero; their precomputed 1 + weight one
    with torch.no_grad():
        for mname, mod in model.named_modules():
            if "Gemma" in type(mod).__name__ and "Norm" in type(mod).__name__:
                mod.weight.zero_()
                if isinstance(getattr(mod, "gemma_weight", None), torch.Tensor):
                    mod.gemma_weight.fill_(1.0)
                gemma.add(f"{mname}.weight")
        for name, param in model.named_parameters():
            if name in gemma:
                pass
            elif name.endswith(("o_proj.weight", "down_proj.weight", "linear_attn.out_proj.weight")):
                param.zero_()
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                param.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                param.zero_()
                param[:, 0] = 1.0
            elif name.endswith("lm_head.weight"):
                param.zero_()
                param[:, 0] = profile["lm_head_col0_other"]
                ids = torch.tensor(profile["tokens"], device=param.device)
                param[ids, 0] = torch.tensor(profile["lm_head_col0"], dtype=param.dtype, device=param.device)
            else:
                continue
            done.append(name)
    return done


def _wrap_dummy_init(module) -> None:
    """Wrap the loader module's ``initialize_dummy_weights`` so that the profile follows the random fill."""
    profile = json.loads(open(os.environ["E2E_PROFILE_JSON"]).read())
    original = module.initialize_dummy_weights

    def initialize_then_profile(model, *args, **kwargs):
        original(model, *args, **kwargs)
        names = apply_profile(model, profile)
        print(f"E2E profile weights: {type(model).__name__}: set {len(names)} tensors", file=sys.stderr,
              flush=True)

    module.initialize_dummy_weights = initialize_then_profile


if os.environ.get("E2E_PROFILE_JSON"):
    try:
        from bench.e2e.import_hook import after_import
    except ImportError as e:  # a hook that silently did nothing would measure something else: stop the process
        raise SystemExit(f"bench/e2e/profile_weights: {e}: the repository root must be on PYTHONPATH") from e
    after_import(_TARGET, _wrap_dummy_init)
