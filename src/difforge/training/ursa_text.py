"""shapes-ursa's prompt tokenizer: Qwen's byte-level BPE layout with one token per world word.

The file is a real ``tokenizer.json`` of the same kind as Qwen's (byte-level alphabet, Qwen's split
regex, Qwen's 26 special tokens with ``<|endoftext|>`` as the pad and ``<|vision_start|>`` as the
begin-of-video token), so the URSA pipeline reads it unchanged.  Its merges spell every word of the
shapes vocabulary after a space as one token (a caption's first word, "a", is one byte anyway), so a
caption of the world is 7 ids and any other text still encodes (in pieces, or byte by byte).
"""

from __future__ import annotations

from tokenizers import Tokenizer

from ..models.ursa.tiny import byte_level_bpe
from ..shapes.world import VOCAB

SPACE = "\u0120"  # the byte-level alphabet's space


def _chain(word: str) -> list[tuple[str, str]]:
    """Merges that build ``word`` left to right (``w``+``o``, ``wo``+``r`` ...)."""
    return [(word[:i], word[i]) for i in range(1, len(word))]


def merges() -> list[tuple[str, str]]:
    """Every spaced word's chain first, then the bare words' (best effort: they may share pieces): a
    spaced word's chain merges rank before every bare-word merge and are the only ones whose left side
    starts with the space, so a spaced word always ends as one token."""
    out: list[tuple[str, str]] = []
    for spelled in [SPACE + w for w in VOCAB] + list(VOCAB):
        for pair in _chain(spelled):
            if pair not in out:
                out.append(pair)
    return out


def build_tokenizer() -> Tokenizer:
    return byte_level_bpe(merges())
