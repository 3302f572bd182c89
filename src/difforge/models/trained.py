"""The built-in *trained* models: small checkpoints in the real layouts whose weights are committed.

``shapes-ursa`` and ``shapes-qwen-edit`` were trained on the shapes world (:mod:`difforge.shapes`) by
the seeded recipes in :mod:`difforge.training` (``make train-shapes``); their folders ship inside the
package (``models/weights/<name>/``), so nothing is built or downloaded at run time.  They load through
the same loaders as real checkpoints.  Unlike the random-weight tiny models they draw what they are
asked for, so a port that scrambles meaning shows it (validate's semantic rung).
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from ..errors import ModelNotFoundError
from ..shapes.prompts import PromptSet, heldout_caption_set, heldout_edit_set
from .families import QWEN_EDIT, URSA

#: name -> family.
TRAINED_MODELS = {"shapes-ursa": URSA, "shapes-qwen-edit": QWEN_EDIT}
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def trained_path(name: str) -> Path:
    """The committed folder of trained model ``name`` (read-only; never written at run time)."""
    folder = WEIGHTS_DIR / name
    if not (folder / "model_index.json").is_file():
        raise ModelNotFoundError(f"The built-in model '{name}' has no weights in {folder}; "
                                 "'make train-shapes' trains them.")
    return folder


def default_prompt_set(name: str, n: int) -> PromptSet | None:
    """The prompt set with expected attributes validate's semantic rung scores for built-in ``name``:
    ``n`` held-out captions (shapes-ursa) or edits (shapes-qwen-edit) of the shapes world, none of which
    training saw; None for any other model (it needs ``--prompt-set``)."""
    if name == "shapes-ursa":
        return heldout_caption_set(n)
    if name == "shapes-qwen-edit":
        return heldout_edit_set(n)
    return None


#: How many of a trained caption model's held-out captions validate uses as its prompts (the family's).
VALIDATION_PROMPTS = 3


def default_prompts(name: str) -> list[str] | None:
    """validate's prompts for built-in ``name`` when ``--prompts`` is not given: a caption model trained
    on the shapes world gets the first held-out captions, since the family's own prompts (URSA's seed
    report sentences) are words it never saw - its picture for them is chance, and a chance picture
    compared once with the reference measures sampling luck, not the port; an edit model gets its first
    held-out edit (the family's "add a beautiful sunset background" is outside its words); None: the family's."""
    pset = default_prompt_set(name, VALIDATION_PROMPTS)
    if pset is None:
        return None
    if pset.kind == "edit":  # every prompt edits the one input picture: the first edit, on its own source
        return [pset.items[0].prompt]
    return [item.prompt for item in pset.items]


def default_source(name: str) -> Image.Image | None:
    """validate's input picture for built-in edit model ``name`` when no ``--image`` is given: the source of
    its first held-out edit (:func:`default_prompts`' instruction acts on it).  The generic synthetic picture
    (sky, disc, ground) is not a shapes scene: the model's edit of it is out of distribution, so both sides
    draw noise and the trajectory rung measures chaos, not the port.  None: the generic picture."""
    pset = default_prompt_set(name, 1)
    if pset is None or pset.kind != "edit":
        return None
    return Image.fromarray(pset.source_image(pset.items[0]))

