"""Model families: native URSA, Qwen-Image-Edit via diffusers, and the registry that tells them apart."""
