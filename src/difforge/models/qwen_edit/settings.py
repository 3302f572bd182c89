"""Per-model run settings difforge reads from an optional ``difforge.json`` in the model folder.

Both edit pipelines resize every reference image to about 1024² before the VAE and (Plus) to
about 384² for the vision-language encoder, whatever output size is asked for.  That is right for
the real models and ruinous for tiny test models on a CPU (the 1024² VAE encode dominates).  The
tiny checkpoints therefore carry smaller areas here; real checkpoints have no such file and get
the diffusers defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ...errors import CheckpointError
from ..checkpoint import SETTINGS_FILE, read_settings, shown

__all__ = ["SETTINGS_FILE", "EditSettings"]

#: The largest area a setting may name: 4096 x 4096, four times the published models' 1024 x 1024 (every
#: reference image is resized to these areas, so 10^12 would allocate without bound).
MAX_AREA = 1 << 24


@dataclass(frozen=True)
class EditSettings:
    """Target pixel areas; each resize keeps the image's aspect ratio, sides rounded to 32."""

    reference_area: int = 1024 * 1024  # what the VAE encodes (and, for Edit, what the VL encoder sees)
    condition_area: int = 384 * 384  # what the VL encoder sees in Edit-Plus
    output_area: int = 1024 * 1024  # the default output size when --height/--width are not given

    @classmethod
    def from_folder(cls, folder: Path) -> EditSettings:
        path = Path(folder) / SETTINGS_FILE
        data = read_settings(folder)
        known = {f.name for f in fields(cls)}
        values: dict[str, int] = {}
        for key, value in data.items():
            if key not in known:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 32 * 32 <= value <= MAX_AREA:
                raise CheckpointError(
                    f"{path}: '{key}' must be an integer area from 1024 to {MAX_AREA} pixels, got {shown(value)}."
                )
            values[key] = value
        return cls(**values)
