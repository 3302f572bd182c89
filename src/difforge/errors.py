"""User-facing errors.

Every failure a user can cause (bad path, bad checkpoint, bad device, bad image, bad size, out of
memory) is raised as a :class:`DifforgeError` subclass that carries exactly one sentence telling the
user what to do.  The CLI prints that sentence and exits with code 2; nothing else reaches the
terminal, so users never see a traceback wall for their own mistakes.
"""

from __future__ import annotations


class DifforgeError(Exception):
    """Base of every error difforge reports to a user as a single actionable sentence."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always
        return " ".join(self.message.split())


class ModelNotFoundError(DifforgeError):
    """The --model path does not exist and is not a built-in name."""


class ModelFamilyError(DifforgeError):
    """The folder holds a model of another family than the command needs."""


class CheckpointError(DifforgeError):
    """A checkpoint file is missing, truncated, corrupt or does not match the config."""


class DeviceError(DifforgeError):
    """The device is unknown or not present on this machine."""


class DtypeError(DifforgeError):
    """The dtype is unknown or not supported on the chosen device."""


class InputError(DifforgeError):
    """An input (image, prompt file, argument) cannot be used."""


class SizeError(InputError):
    """Height/width is not a multiple of what the model needs."""


class StepsError(InputError):
    """The number of denoising steps is out of range."""


class OutputError(DifforgeError):
    """An output path cannot be written (a directory, no permission, disk full ...)."""


class DeviceOutOfMemoryError(DifforgeError):
    """The device ran out of memory; the message names the offload plan to try."""


def out_of_memory_message(device: str, current_plan: str, family: str | None = None) -> str:
    """Suggest the next, leaner memory plan after an out-of-memory failure.

    URSA's plans only differ in where the transformer and VAE wait (``model`` and ``sequential`` are
    the same there) and it has no VAE tiling; Qwen-Image-Edit has the full ladder plus ``--vae-tiling``.
    On the CPU every offload plan only moves weights from host memory to host memory, so none can
    help: the hint is a smaller image or dtype instead.
    """
    if device.split(":")[0] == "cpu":
        tiling = "" if family == "ursa" else ", use --vae-tiling"
        return (
            f"{device} ran out of memory; offloading cannot help on the CPU (the weights already live in host"
            f" memory): reduce --height/--width{tiling} or use --dtype bfloat16."
        )
    if family == "ursa":
        ladder = ["none", "before-decode", "model"]
        tail = "reduce --height/--width or use a smaller --dtype"
    else:
        ladder = ["none", "before-decode", "model", "sequential"]
        tail = "reduce --height/--width or use --vae-tiling"
    idx = ladder.index(current_plan) if current_plan in ladder else len(ladder) - 1
    if idx + 1 < len(ladder):
        nxt = ladder[idx + 1]
        tiling = " and --vae-tiling" if family != "ursa" and nxt not in ("before-decode",) else ""
        hint = f"retry with --offload {nxt}{tiling}"
    else:
        hint = tail
    return f"{device} ran out of memory with --offload {current_plan}; {hint}."


def is_out_of_memory(exc: BaseException) -> bool:
    """Recognise OOM errors from every backend (CUDA, NPU, MPS, XPU, host allocator)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc).lower()
    return any(
        s in text
        for s in ("out of memory", "npu out of memory", "mps backend out of memory", "can't allocate memory")
    )
