"""A byte-level tokenizer, so the engine needs no downloaded vocabulary.

Ids 0..255 are raw bytes; a few special ids follow. Any UTF-8 text round-trips, which keeps
probe prompts and recorded baselines human-readable.
"""

from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
MASK_ID = 259
VOCAB_SIZE = 260
SPECIAL_IDS = frozenset({BOS_ID, EOS_ID, PAD_ID, MASK_ID})


def encode(text: str, add_bos: bool = True) -> list[int]:
    """Text -> ids; BOS first so that an empty prompt still has one token to prefill."""
    ids = list(text.encode("utf-8"))
    return [BOS_ID, *ids] if add_bos else ids


def decode(ids: list[int]) -> str:
    """Ids -> text; special ids are dropped and invalid UTF-8 is replaced, never raised."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
