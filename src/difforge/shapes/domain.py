"""What prompts a model was trained to understand, and what to say when a prompt leaves that domain.

A model trained on a small world (the shapes models: 27 words, and for ``shapes-ursa`` captions of one
item) draws noise for anything else - "a purple star", a two-item caption, "add a beautiful sunset" -
and nothing in the numbers of a run says so: the device and the reference draw the same noise.  A
model folder that knows its domain says it in its ``difforge.json``::

    "prompt_domain": {"vocabulary": "shapes", "kind": "caption", "max_items": 1}

* ``vocabulary``: ``"shapes"`` (the world's :data:`~.world.VOCAB`) or a list of words (at most
  :data:`MAX_WORDS`, each at most :data:`MAX_WORD_CHARS` characters);
* ``kind`` (optional): ``"caption"`` - a prompt must also be a caption of the shapes world
  (:func:`~.world.parse_caption`) - or ``"edit"`` (an instruction: only the vocabulary is checked);
* ``max_items`` (optional, captions): the most items a caption the model was trained on names.

:meth:`PromptDomain.notes` returns one sentence per way a prompt leaves the domain (empty when it stays
inside); the engine prints them as one warning line and keeps them in the RunRecord
(``extra["prompt_domain"]``).  Words are compared lower-cased with the punctuation around them dropped
("Image." is "image").  Nothing here refuses a prompt: the run still happens, it just does not pass
silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError
from .world import VOCAB, parse_caption

#: The key of ``difforge.json`` that holds a model's prompt domain.
SETTINGS_KEY = "prompt_domain"
#: Words a ``vocabulary`` list may hold, and characters per word (a model's own file is hostile input too).
MAX_WORDS = 65_536
MAX_WORD_CHARS = 64
#: Words named in a note before "and N more".
SHOWN_WORDS = 6
KINDS = ("caption", "edit")
_WORD = re.compile(r"\S+")
_EDGE_PUNCTUATION = ".,;:!?\"'()[]{}"


def words_of(prompt: str) -> list[str]:
    """The prompt's words, lower-cased, with the punctuation around each dropped (empty ones skipped)."""
    out = []
    for raw in _WORD.findall(prompt.lower()):
        word = raw.strip(_EDGE_PUNCTUATION)
        if word:
            out.append(word)
    return out


@dataclass(frozen=True)
class PromptDomain:
    """The words (and, for shapes captions, the grammar and item count) a model was trained on."""

    vocabulary: frozenset[str]
    kind: str | None = None
    max_items: int | None = None
    name: str = "this model"

    @classmethod
    def from_settings(cls, value: Any, name: str, where: str) -> PromptDomain:
        """The ``prompt_domain`` entry of ``where`` (a difforge.json), checked; one CheckpointError otherwise."""
        if not isinstance(value, Mapping):
            raise CheckpointError(f"{where}: '{SETTINGS_KEY}' must be an object with a 'vocabulary'.")
        unknown = sorted(set(value) - {"vocabulary", "kind", "max_items"})
        if unknown:
            raise CheckpointError(f"{where}: '{SETTINGS_KEY}' has unknown key(s) {', '.join(map(repr, unknown))}.")
        vocab = value.get("vocabulary")
        if vocab == "shapes":
            words = frozenset(VOCAB)
        elif (isinstance(vocab, list) and 0 < len(vocab) <= MAX_WORDS
              and all(isinstance(w, str) and 0 < len(w) <= MAX_WORD_CHARS for w in vocab)):
            words = frozenset(w.lower() for w in vocab)
        else:
            raise CheckpointError(f"{where}: '{SETTINGS_KEY}.vocabulary' must be \"shapes\" or a list of 1 to "
                                  f"{MAX_WORDS} words of at most {MAX_WORD_CHARS} characters.")
        kind = value.get("kind")
        if kind is not None and kind not in KINDS:
            raise CheckpointError(f"{where}: '{SETTINGS_KEY}.kind' must be one of {', '.join(KINDS)}.")
        items = value.get("max_items")
        if items is not None and (isinstance(items, bool) or not isinstance(items, int) or not 1 <= items <= 64):
            raise CheckpointError(f"{where}: '{SETTINGS_KEY}.max_items' must be a whole number from 1 to 64.")
        if items is not None and kind != "caption":
            raise CheckpointError(f"{where}: '{SETTINGS_KEY}.max_items' applies to kind \"caption\" only.")
        return cls(words, kind, items, name)

    def outside(self, prompt: str) -> list[str]:
        """The prompt's words the vocabulary lacks, in order, each once."""
        seen: dict[str, None] = {}
        for word in words_of(prompt):
            if word not in self.vocabulary:
                seen.setdefault(word, None)
        return list(seen)

    def notes(self, prompt: str) -> list[str]:
        """One sentence per way ``prompt`` leaves the domain (empty: it stays inside)."""
        if not prompt or not prompt.strip():
            return []
        out: list[str] = []
        strangers = self.outside(prompt)
        if strangers:
            shown = ", ".join(repr(w) for w in strangers[:SHOWN_WORDS])  # repr: a control character shows escaped
            more = f" and {len(strangers) - SHOWN_WORDS} more" if len(strangers) > SHOWN_WORDS else ""
            out.append(f"{shown}{more} {'is' if len(strangers) == 1 else 'are'} outside {self.name}'s vocabulary "
                       f"of {len(self.vocabulary)} words")
        elif self.kind == "caption" and self.vocabulary == frozenset(VOCAB):
            try:
                _background, things = parse_caption(prompt)
            except ValueError:
                out.append(f"it is not a caption of the shapes world {self.name} was trained on "
                           "('a <colour> <shape> on a <colour> background')")
            else:
                if self.max_items is not None and len(things) > self.max_items:
                    out.append(f"it names {len(things)} items; {self.name} was trained on captions of "
                               f"{self.max_items} item{'s' * (self.max_items != 1)}")
        return out

    def warning(self, prompt: str) -> str | None:
        """The one warning line for ``prompt`` (None when it stays inside the domain)."""
        notes = self.notes(prompt)
        if not notes:
            return None
        return (f"the prompt {prompt[:80]!r}{'...' if len(prompt) > 80 else ''} leaves what {self.name} was "
                f"trained on: {'; '.join(notes)}; expect a picture that does not follow it.")


def domain_from_settings(settings: Mapping[str, Any], name: str, where: str) -> PromptDomain | None:
    """The model's prompt domain from its difforge.json settings, or None when it declares none."""
    if SETTINGS_KEY not in settings:
        return None
    return PromptDomain.from_settings(settings[SETTINGS_KEY], name, where)


__all__ = ["SETTINGS_KEY", "PromptDomain", "domain_from_settings", "words_of"]
