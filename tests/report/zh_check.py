"""Find English sentences left in Chinese text (a zh report, a translated run-time string).

:func:`english_left` flags every run of three or more consecutive English words.  A word is a token of
two or more ASCII letters (an apostrophe or hyphen inside it allowed: ``floor's``, ``teacher-forced``);
names and code are not words: anything with a digit, dot, underscore, slash or a leading ``-`` (tensor
and block names, dtypes, flags, shapes, units like ``TFLOP/s``), CamelCase and ALL-CAPS tokens (class
names, PASS/WARN/FAIL, SDPA, RMSE), and the names in :data:`NAMES` (libraries, devices, model names,
units).  A run is broken by a line break, by anything that is not ASCII (a CJK character, full-width
punctuation), by a name or by code, and quoted text ("...") is not read at all, so a
quoted log line does not count.

:func:`visible_html` and :func:`visible_markdown` give the text a reader sees in report.html /
report.md, without code (``<code>``, ``<pre>``, fences, inline code), scripts, styles, image alt
texts and link targets.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

#: Lower-case names kept in English on purpose (libraries, tools, devices, model and option names, units,
#: and the technical words the zh prose itself keeps: block, seed, token, prompt, dtype ...).
_NAMES = (
    "torch diffusers transformers msprobe difforge safetensors accelerate inductor torchair eager philox sdpa "
    "cuda cpu npu mps xpu gpu ascend nvidia cann torch_npu tensorboard pip "
    "tiny-ursa tiny-qwen-edit ursa qwen qwen-image-edit qwenimage "
    "transformer vae block blocks seed token tokens prompt prompts dtype logits argmax rsqrt ids ulp metric "
    "softmax linear matmul embedding interpolate normalize silu gelu rotary swiglu attention "
    "ms dB db mib gib kib it rel-l2 dual-n"
)
NAMES = frozenset(_NAMES.split())

_CHUNK = re.compile(r"[A-Za-z0-9_.\-/+#'*^|%@]+")
_WORD = re.compile(r"[A-Za-z][A-Za-z]*(?:['-][A-Za-z]+)*")
_QUOTED = re.compile(r"\"[^\"\n]*\"|“[^”\n]*”")


def _is_word(chunk: str) -> bool:
    """An English word (not a name, not code)."""
    token = chunk.strip("'")
    if not _WORD.fullmatch(token) or len(token.replace("'", "").replace("-", "")) < 2:
        return False
    if token.lower().removesuffix("'s") in NAMES or token.lower() in NAMES:
        return False
    if token.isupper():  # PASS, SDPA, RMSE, MFU ...
        return False
    return not re.search(r".[A-Z]", token.replace("-", ""))  # CamelCase: a class or model name (OSError)


def english_left(text: str, min_words: int = 3) -> list[str]:
    """Each run of ``min_words`` or more consecutive English words in ``text``."""
    text = _QUOTED.sub(" ", text)
    found: list[str] = []
    run: list[re.Match[str]] = []

    def close() -> None:
        if len(run) >= min_words:
            found.append(text[run[0].start():run[-1].end()])
        run.clear()

    last_end = 0
    for m in _CHUNK.finditer(text):
        gap = text[last_end:m.start()]
        if "\n" in gap or any(not ch.isascii() for ch in gap):
            close()
        last_end = m.end()
        if _is_word(m.group(0)):
            run.append(m)
        else:
            close()
    close()
    return found


class _Visible(HTMLParser):
    """The text nodes a reader sees: no code, pre, script, style (attributes, alt texts included, are skipped)."""

    HIDDEN = {"code", "pre", "script", "style", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self.HIDDEN:
            self.depth += 1
        elif tag in ("br", "p", "div", "li", "td", "th", "tr", "h1", "h2", "h3", "h4", "figcaption"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN and self.depth:
            self.depth -= 1
        elif tag in ("td", "th", "p", "li"):
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.parts.append(data)


def visible_html(html: str) -> str:
    parser = _Visible()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


def visible_markdown(md: str) -> str:
    """report.md without fenced code, inline code, images' alt texts and link targets, escapes undone."""
    lines: list[str] = []
    fence: str | None = None
    for line in md.splitlines():
        m = re.match(r"\s*(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            continue
        lines.append(line)
    text = "\n".join(lines)
    text = re.sub(r"(`+)(.+?)\1", " ", text)  # inline code
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)  # images
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    return re.sub(r"\\(.)", r"\1", text)


__all__ = ["NAMES", "english_left", "visible_html", "visible_markdown"]
