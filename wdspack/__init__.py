"""wdspack: pre-packed WebDataset shards for vision-language training."""

from .packing import ALGORITHMS, lower_bound, plan_packs

__version__ = "0.1.0"
__all__ = ["ALGORITHMS", "lower_bound", "plan_packs", "__version__"]
