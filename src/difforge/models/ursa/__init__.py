"""Native URSA (BAAI's discrete flow-matching text-to-image model) in plain, portable PyTorch."""

from .config import SchedulerConfig, URSATransformerConfig, VQConfig
from .pipeline import URSAPipeline, URSAPipelineOutput
from .scheduler import DFMScheduler, timestep_t
from .transformer import URSATransformer
from .vae import AutoencoderVQ

__all__ = [
    "AutoencoderVQ",
    "DFMScheduler",
    "SchedulerConfig",
    "URSAPipeline",
    "URSAPipelineOutput",
    "URSATransformer",
    "URSATransformerConfig",
    "VQConfig",
    "timestep_t",
]
