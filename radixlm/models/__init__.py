"""Models: the Llama family, weight loading (HF safetensors dirs, GGUF), the registry."""

from radixlm.models.base import CausalLM
from radixlm.models.loader import (
    ModelNotFoundError,
    default_model_path,
    load_model,
    load_model_config,
    resolve_model_path,
)
from radixlm.models.model_config import ModelConfig
from radixlm.models.registry import get_model_class, supported_architectures

__all__ = ["CausalLM", "ModelConfig", "ModelNotFoundError", "default_model_path",
           "get_model_class", "load_model", "load_model_config", "resolve_model_path",
           "supported_architectures"]
