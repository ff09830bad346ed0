"""`load_model`: checkpoint on disk -> eval-mode nn.Module (paths: radixlm/model_path.py)."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.model_path import (  # noqa: F401  (re-exported by radixlm.models)
    ModelNotFoundError, default_model_path, resolve_model_path,
)
from radixlm.models.gguf_loader import iter_gguf_weights, open_gguf
from radixlm.models.hf_loader import iter_hf_weights, load_hf_config
from radixlm.models.linear import LinearPolicy, apply_linear_policy
from radixlm.models.model_config import ModelConfig
from radixlm.models.parallel_context import SINGLE, ParallelContext
from radixlm.models.registry import get_model_class


def load_model_config(model_path: str) -> ModelConfig:
    """The config alone (cheap: GGUF tensors stay on disk)."""
    if model_path.endswith(".gguf"):
        return ModelConfig.from_gguf_metadata(open_gguf(model_path))
    return load_hf_config(model_path)


def load_model(model_path: str, dtype: torch.dtype, device: torch.device | str,
               show_progress: bool = False, ctx: ParallelContext = SINGLE,
               linear_policy: LinearPolicy | None = None) -> tuple[nn.Module, ModelConfig]:
    """Build the model directly on `device` in `dtype` and load its weights.

    Under tensor parallelism (`ctx`) the model holds only rank `ctx.tp_rank`'s slices:
    the loaders still yield whole checkpoint tensors, one at a time, and each parallel
    layer copies its slice out (models/parallel_layers.py).

    The module is created on the meta device (no memory, no random init) and
    materialized once with `to_empty`, so peak memory is the weights plus one
    checkpoint tensor. Then every linear layer gets its LinearMethod (`linear_policy`,
    default: dense, oneDNN-prepacked on the CPU; models/linear/policy.py).
    """
    policy = linear_policy or LinearPolicy()
    if model_path.endswith(".gguf"):
        reader = open_gguf(model_path)
        config = ModelConfig.from_gguf_metadata(reader)
        weights = iter_gguf_weights(reader, config, dtype, show_progress,
                                    int4=policy.keeps_int4(dtype, torch.device(device)),
                                    int8=policy.keeps_int8(dtype, torch.device(device)))
    else:
        config = load_hf_config(model_path)
        weights = iter_hf_weights(model_path, dtype)
    model_cls = get_model_class(config.architecture)
    with torch.device("meta"):
        model = model_cls(config, ctx)
    model = model.to(dtype=dtype).to_empty(device=torch.device(device))
    model.init_non_persistent_buffers()
    model.load_weights(weights)
    apply_linear_policy(model, policy)
    return model.eval(), config
