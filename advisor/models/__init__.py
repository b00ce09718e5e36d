"""Model specs: built-in presets, Hugging Face configs and user factories, behind one adapter."""

from advisor.models.adapter import ModelAdapter
from advisor.models.presets import PRESETS
from advisor.models.registry import build_model, parse_model_args

__all__ = ["PRESETS", "ModelAdapter", "build_model", "parse_model_args"]
