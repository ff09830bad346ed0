"""Architecture name -> model class: HF config.json `architectures[0]`, or the name a
GGUF `general.architecture` maps to (model_config.py's `_GGUF_ARCH_TO_ARCH`). Each family
is one file on the shared decoder (models/decoder.py)."""

from __future__ import annotations

from torch import nn

from radixlm.models.gemma3 import Gemma3ForCausalLM
from radixlm.models.llama import LlamaForCausalLM
from radixlm.models.mixtral import MixtralForCausalLM
from radixlm.models.qwen3 import Qwen3ForCausalLM
from radixlm.models.qwen3_moe import Qwen3MoeForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return _MODELS[architecture]
    except KeyError:
        raise ValueError(f"unsupported model architecture {architecture!r}; supported: "
                         f"{', '.join(supported_architectures())}") from None
