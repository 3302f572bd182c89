"""Prompt tokenisation: Qwen's byte-level BPE from ``tokenizer/tokenizer.json``.

The reference calls its tokenizer with ``max_length=320, padding="max_length", padding_side="left",
truncation=True``: the first 320 ids are kept and the row is left-padded with the pad id.  Qwen's
tokenizer adds no BOS/EOS, so the ``tokenizers`` library's ``encode(..., add_special_tokens=False)``
gives the same ids without needing transformers, ``vocab.json`` or ``merges.txt``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer

from ...config import check_text
from ...errors import CheckpointError
from ..checkpoint import TOKENIZER_LIMIT, library_panics, read_json, read_model_bytes

DEFAULT_PAD = "<|endoftext|>"


def prompt_list(text: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    """One prompt or several as a list (None stays None): how many rows a call denoises per image."""
    if text is None:
        return None
    return [text] if isinstance(text, str | bytes) else list(text)  # bytes: one (bad) prompt, not a list of ints


#: Text encoded once at load: ordinary words plus long runs of one character, the inputs on which a
#: hostile normalizer or pre-tokenizer regex backtracks without end.  A tokenizer that panics on it is
#: refused before any prompt reaches it.
PROBE_TEXT = " ".join(["a red circle left of a blue square, 0123456789 ~!?", "a" * 64, " " * 64, "1" * 64, "!" * 64,
                       "é" * 32, "\u4e2d" * 32, "a b " * 32])
#: A token covers at most this many characters for the prompt cut (see :meth:`PromptTokenizer.cut`); a
#: vocabulary with longer tokens is hostile, and only loses exactness past this bound, never memory.
MAX_TOKEN_CHARS = 1024
#: Characters per byte of a token, generously: a normalizer may compose several input characters into
#: one (NFC turns three Hangul jamo into one syllable).
CHARS_PER_TOKEN_BYTE = 4


class PromptTokenizer:
    def __init__(self, tokenizer: Tokenizer, pad_id: int, max_length: int = 320, max_chars: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.max_length = max_length
        self.max_chars = max_chars if max_chars is not None else max_length * MAX_TOKEN_CHARS * CHARS_PER_TOKEN_BYTE

    @classmethod
    def from_folder(cls, folder: Path, max_length: int = 320, root: Path | None = None) -> PromptTokenizer:
        """Read ``tokenizer.json`` (and ``tokenizer_config.json``'s ``pad_token``) by the one reading rule.

        ``root`` is the model folder every file must lie inside (default: the folder above ``folder``);
        tokenizer.json is capped at :data:`~..checkpoint.TOKENIZER_LIMIT` and parsed from those bytes,
        so the library never opens a path itself.  A panic of the Rust library, at load or on the probe
        text, is one CheckpointError.
        """
        root = Path(root) if root is not None else Path(folder).parent
        path = folder / "tokenizer.json"
        if not os.path.lexists(path):
            raise CheckpointError(f"Missing {path}; the URSA tokenizer folder needs tokenizer.json.")
        raw = read_model_bytes(path, root, TOKENIZER_LIMIT)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{path} is not UTF-8 text (byte {exc.start} cannot be decoded).") from None
        with library_panics(str(path)):
            try:
                tok = Tokenizer.from_str(text)
            except Exception as exc:  # tokenizers raises a bare Exception for malformed files
                reason = " ".join(str(exc).split())[:200]
                raise CheckpointError(f"{path} cannot be read as a tokenizer ({reason}).") from None
            tok.no_truncation()  # truncation and padding are this class's job, whatever the file says
            tok.no_padding()
            try:
                tok.encode(PROBE_TEXT, add_special_tokens=False)
            except Exception as exc:
                reason = " ".join(str(exc).split())[:200]
                raise CheckpointError(f"{path} cannot encode plain text ({reason}); the tokenizer is damaged.") from None
            longest = max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=1)
        pad_token = _pad_token(folder / "tokenizer_config.json", root)
        pad_id = tok.token_to_id(pad_token)
        if pad_id is None:
            raise CheckpointError(f"{path} has no pad token '{pad_token}'.")
        max_chars = max_length * max(1, min(longest, MAX_TOKEN_CHARS)) * CHARS_PER_TOKEN_BYTE
        return cls(tok, pad_id, max_length, max_chars)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def cut(self, text: str) -> str:
        """``text`` cut to the characters that can reach the first ``max_length`` tokens (plus a margin).

        A token covers at most the longest vocabulary entry's characters (times a normalizer's
        composition), so the first ``max_length`` ids of the cut text are those of the whole text,
        while a 26 MB prompt line is no longer tokenised whole (5.8 GB) only to keep 320 ids.
        """
        return text if len(text) <= self.max_chars else text[: self.max_chars]

    def encode(self, texts: list[str]) -> torch.Tensor:
        """``[len(texts), max_length]`` int64, truncated to the first ``max_length`` ids, left-padded.

        Texts are checked first (str, valid UTF-8): the diffusers-style ``pipe(prompt=...)`` reaches
        here without a RunConfig, and ``tokenizers`` reports bytes or lone surrogates only as a bare
        TypeError.  Each is cut (:meth:`cut`) before the library sees it.
        """
        check_text(list(texts), "The prompt")
        rows = torch.full((len(texts), self.max_length), self.pad_id, dtype=torch.int64)
        with library_panics("The tokenizer (tokenizer.json)"):
            encoded = self.tokenizer.encode_batch([self.cut(t) for t in texts], add_special_tokens=False)
        for i, enc in enumerate(encoded):
            ids = enc.ids[: self.max_length]
            if ids:
                rows[i, self.max_length - len(ids) :] = torch.tensor(ids, dtype=torch.int64)
        return rows


def _pad_token(path: Path, root: Path) -> str:
    """``tokenizer_config.json``'s ``pad_token`` (a string, or ``{"content": string}``), else the default.

    Anything else (an integer, a list, an empty string) is one CheckpointError: ``tokenizers`` would
    crash on it with a bare TypeError."""
    if not os.path.lexists(path):
        return DEFAULT_PAD
    pad = read_json(path, root=root).get("pad_token")
    content = pad.get("content") if isinstance(pad, dict) else pad
    if content is None:
        return DEFAULT_PAD
    if not isinstance(content, str) or not content:
        raise CheckpointError(f"{path}: 'pad_token' must be a token string (or {{\"content\": string}}), got "
                              f"{repr(pad)[:60]}.")
    return content
