"""The model families difforge runs: one name each, shared by the registry, the pipelines and the probes."""

from __future__ import annotations

URSA = "ursa"
QWEN_EDIT = "qwen-edit"
QWEN_EDIT_PLUS = "qwen-edit-plus"
#: Which families each job accepts.
TASK_FAMILIES = {"generate": (URSA,), "edit": (QWEN_EDIT, QWEN_EDIT_PLUS)}
