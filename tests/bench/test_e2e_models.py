"""bench/e2e/models' `rand` and `hyb` makers (mk_models, mk_hybrid), run as gpu_run.sh runs them: what they write is
what the driver's configurations and SGLang read (the configs, the tokenizer, the drafter's weights), and the same
seed writes the same bytes."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make(out: Path) -> None:
    for args in (["mk_models", str(out)], ["mk_hybrid", str(out), str(out)]):
        r = subprocess.run([sys.executable, "-m", f"bench.e2e.models.{args[0]}", *args[1:]], capture_output=True,
                           text=True, cwd=ROOT, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip().splitlines()[-1].startswith("ok "), r.stdout  # the maker's own last line


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow  # two model makers, twice (about 30 s on 2 cores)
def test_rand_and_hyb_model_sets(tmp_path: Path):
    _make(tmp_path / "a")
    a = tmp_path / "a"
    target = json.loads((a / "tiny-qwen3" / "config.json").read_text())
    assert target["architectures"] == ["Qwen3ForCausalLM"] and target["num_hidden_layers"] == 4
    assert target["vocab_size"] == 512 and not target["tie_word_embeddings"]
    draft = json.loads((a / "tiny-dflash" / "config.json").read_text())
    assert draft["architectures"] == ["DFlashDraftModel"] and draft["num_hidden_layers"] == 1
    # the drafter reads target layers below the last one (the target captures the input of layer id + 1)
    assert draft["dflash_config"]["target_layer_ids"] == [0, 2] and draft["dflash_config"]["block_size"] == 4
    vocab = json.loads((a / "tiny-qwen3" / "tokenizer.json").read_text())["model"]["vocab"]
    assert draft["dflash_config"]["mask_token_id"] == vocab["<|mask|>"]
    hyb = json.loads((a / "tiny-next" / "config.json").read_text())
    assert hyb["full_attention_interval"] == 4  # SGLang's own Qwen3-Next config class needs it
    assert hyb["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    hyb_draft = json.loads((a / "tiny-next-dflash" / "config.json").read_text())
    assert hyb_draft["hidden_size"] == hyb["hidden_size"] == 128
    assert hyb_draft["dflash_config"]["mask_token_id"] == draft["dflash_config"]["mask_token_id"]
    for d in ("tiny-qwen3", "tiny-dflash", "tiny-next", "tiny-next-dflash"):
        assert (a / d / "tokenizer.json").is_file() and list((a / d).glob("*.safetensors")), d
    _make(tmp_path / "b")
    assert _digests(a) == _digests(tmp_path / "b")  # seeded: the same bytes every time
