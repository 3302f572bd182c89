"""Make transformers' Qwen2-VL processor usable on hosts without torchvision.

transformers 5.x type-checks the processor's ``video_processor`` slot against a class that only
exists when torchvision is installed, so constructing, saving and loading ``Qwen2VLProcessor``
all fail without it (and torchvision cannot be installed beside every torch build, e.g. Ascend's).
The edit pipelines never use video, so when torchvision is missing we make the processor report
only its image and text parts.  The patch is applied once per process and is a no-op when
torchvision is present.
"""

from __future__ import annotations

import importlib.util
from typing import Any

_APPLIED = False


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def apply_processor_shim() -> bool:
    """Patch ``Qwen2VLProcessor.get_attributes`` once; return True when the patch is active."""
    global _APPLIED
    if _APPLIED:
        return True
    if torchvision_available():
        return False
    from transformers import Qwen2VLProcessor

    original = Qwen2VLProcessor.get_attributes.__func__  # the undecorated classmethod body

    def get_attributes(cls: type) -> list[Any]:
        return [name for name in original(cls) if name != "video_processor"]

    Qwen2VLProcessor.get_attributes = classmethod(get_attributes)
    _APPLIED = True
    return True
