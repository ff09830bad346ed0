"""The eager decode step's per-layer path stays off nn.Module.__call__ (its hook and
tracing checks cost microseconds per call, x 8 calls x layers per step): no module
inside a decoder layer is entered through __call__, so the step's module calls do not
grow with the layer count. (The logits are checked against HF's in test_models_logits.)"""

from __future__ import annotations

import torch
import transformers
from torch.nn.modules.module import register_module_forward_pre_hook

from radixlm.models import load_model
from tests.conftest_models import PoolHarness


def _tiny_llama(tmp_path) -> tuple[torch.nn.Module, object]:
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    hf.save_pretrained(tmp_path)
    return load_model(str(tmp_path), torch.float32, "cpu")


def test_decode_layers_bypass_module_call(tmp_path):
    model, config = _tiny_llama(tmp_path)
    h = PoolHarness(model, config)
    row = h.new_request()
    h.extend([row], [[5, 6, 7, 8]])
    layer_modules = {id(m) for layer in model.model.layers for m in layer.modules()}
    called: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}

    def record(module: torch.nn.Module, args: tuple) -> None:
        if id(module) in layer_modules:
            called.append(names.get(id(module), type(module).__name__))

    handle = register_module_forward_pre_hook(record)
    try:
        logits = h.decode([row], [9])
    finally:
        handle.remove()
    assert logits.shape == (1, 128)
    assert called == [], f"called through nn.Module.__call__: {called[:8]}"

