"""MoE checkpoints in the fused expert layout load and match transformers.

transformers here saves MoE experts one tensor per expert and projection, so the fused
branch of `models/moe_checkpoint.py` (`mlp.experts.gate_up_proj` [E, 2 * inter, hidden],
`mlp.experts.down_proj` [E, hidden, inter], transformers 5's layout) is exercised by
rewriting a saved checkpoint into that layout: the per-expert tensors are removed, so
the model can only load through the split. Logits must match HF's model (same weights).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from radixlm.models import load_model
from tests.conftest_models import PoolHarness, rel_err

_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
CASES = {
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True),
    "mixtral": lambda: transformers.MixtralConfig(
        **_COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}
# Per-expert names as saved: Qwen3-MoE's, and Mixtral's transformers-4 names (w1 gate,
# w2 down, w3 up).
_PER_EXPERT = re.compile(r"^(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                         r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def _to_fused(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same weights with every layer's experts stacked into gate_up_proj / down_proj."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in state.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = t
            continue
        layer, e, proj = m.group(1), int(m.group(2)), m.group(3)
        experts.setdefault(layer, {}).setdefault(e, {})[_PROJ.get(proj, proj)] = t
    assert experts, "no per-expert tensors in the saved checkpoint"
    for layer, by_e in experts.items():
        ids = sorted(by_e)
        assert ids == list(range(len(ids)))
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([by_e[e]["gate_proj"], by_e[e]["up_proj"]]) for e in ids]).contiguous()
        out[f"{layer}.mlp.experts.down_proj"] = torch.stack(
            [by_e[e]["down_proj"] for e in ids]).contiguous()
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def fused_pair(request, tmp_path_factory):
    hf = transformers.AutoModelForCausalLM.from_config(CASES[request.param](),
                                                       dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
    hf.eval()
    path = Path(tmp_path_factory.mktemp(request.param))
    hf.save_pretrained(path)
    files = sorted(path.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
        f.unlink()
    for index in path.glob("*.safetensors.index.json"):
        index.unlink()
    fused = _to_fused(state)
    assert not any(_PER_EXPERT.match(n) for n in fused)
    save_file(fused, str(path / "model.safetensors"), metadata={"format": "pt"})
    return hf, str(path)


def test_fused_expert_layout_matches_hf(fused_pair) -> None:
    hf, path = fused_pair
    assert "gate_up_proj" in json.dumps(list(load_file(f"{path}/model.safetensors")))
    model, config = load_model(path, torch.float32, "cpu")
    ids = torch.randint(3, 256, (14,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    h = PoolHarness(model, config)
    row = h.new_request()
    got = h.extend([row], [ids[:10]], all_logits=True)
    assert rel_err(got, ref[:10]) < 1e-4
    for i, tok in enumerate(ids[10:]):
        assert rel_err(h.decode([row], [tok])[0], ref[10 + i]) < 1e-4, f"decode step {i}"
