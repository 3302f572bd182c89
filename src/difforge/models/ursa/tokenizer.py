"""Prompt tokenisation: Qwen's byte-level BPE from ``tokenizer/tokenizer.json``.

The reference calls its tokenizer with ``max_length=320, padding="max_length", padding_side="left",
truncation=True``: the first 320 ids are kept and the row is left-padded with the pad id.  Qwen's
tokenizer adds no BOS/EOS, so the ``tokenizers`` library's ``encode(..., add_special_tokens=False)``
gives the same ids without needing transformers, ``vocab.json`` or ``merges.txt``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from ...config import check_text
from ...errors import CheckpointError
from ..checkpoint import read_json

DEFAULT_PAD = "<|endoftext|>"


def prompt_list(text: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    """One prompt or several as a list (None stays None): how many rows a call denoises per image."""
    if text is None:
        return None
    return [text] if isinstance(text, str | bytes) else list(text)  # bytes: one (bad) prompt, not a list of ints


class PromptTokenizer:
    def __init__(self, tokenizer: Tokenizer, pad_id: int, max_length: int = 320) -> None:
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.max_length = max_length

    @classmethod
    def from_folder(cls, folder: Path, max_length: int = 320) -> PromptTokenizer:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"Missing {path}; the URSA tokenizer folder needs tokenizer.json.")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise CheckpointError(f"{path} cannot be read as a tokenizer ({exc}).") from None
        tok.no_truncation()  # truncation and padding are this class's job, whatever the file says
        tok.no_padding()
        pad_token = DEFAULT_PAD
        cfg_path = folder / "tokenizer_config.json"
        if cfg_path.is_file():
            pad = read_json(cfg_path).get("pad_token")
            pad = pad.get("content") if isinstance(pad, dict) else pad
            pad_token = pad or DEFAULT_PAD
        pad_id = tok.token_to_id(pad_token)
        if pad_id is None:
            raise CheckpointError(f"{path} has no pad token '{pad_token}'.")
        return cls(tok, pad_id, max_length)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str]) -> torch.Tensor:
        """``[len(texts), max_length]`` int64, truncated to the first ``max_length`` ids, left-padded.

        Texts are checked first (str, valid UTF-8): the diffusers-style ``pipe(prompt=...)`` reaches
        here without a RunConfig, and ``tokenizers`` reports bytes or lone surrogates only as a bare
        TypeError.
        """
        check_text(list(texts), "The prompt")
        rows = torch.full((len(texts), self.max_length), self.pad_id, dtype=torch.int64)
        for i, enc in enumerate(self.tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            ids = enc.ids[: self.max_length]
            if ids:
                rows[i, self.max_length - len(ids) :] = torch.tensor(ids, dtype=torch.int64)
        return rows
