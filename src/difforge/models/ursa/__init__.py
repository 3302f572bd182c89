"""Native URSA (BAAI's discrete flow-matching text-to-image model) in plain, portable PyTorch.

``__all__`` is the family's public seam: what callers outside ``difforge.models`` (the benchmarks and
scripts, ``tests/test_architecture.py`` checks them) may use; the modules behind it are internals.
"""

from .call import EXACT_OPTIMISATIONS, PHILOX_RNG
from .config import SchedulerConfig, URSATransformerConfig, VQConfig
from .loader import URSACheckpoint
from .pipeline import URSAPipeline, URSAPipelineOutput
from .rope import positions
from .sampling import DEVICE_CHUNK, GUMBEL_MAX, HOST_CHUNK, INVERSE_CDF
from .scheduler import DFMScheduler, timestep_t
from .tiny import build_tiny_ursa_video
from .transformer import URSATransformer, run_layer
from .vae import AutoencoderVQ

__all__ = [
    "DEVICE_CHUNK",
    "EXACT_OPTIMISATIONS",
    "GUMBEL_MAX",
    "HOST_CHUNK",
    "INVERSE_CDF",
    "PHILOX_RNG",
    "AutoencoderVQ",
    "DFMScheduler",
    "SchedulerConfig",
    "URSACheckpoint",
    "URSAPipeline",
    "URSAPipelineOutput",
    "URSATransformer",
    "URSATransformerConfig",
    "VQConfig",
    "build_tiny_ursa_video",
    "positions",
    "run_layer",
    "timestep_t",
]
