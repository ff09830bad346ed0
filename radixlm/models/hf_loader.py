"""Local HF checkpoint directories: config.json + *.safetensors."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open

from radixlm.models.model_config import ModelConfig


def load_hf_config(model_dir: str) -> ModelConfig:
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    gen_path = os.path.join(model_dir, "generation_config.json")
    gen_cfg = None
    if os.path.exists(gen_path):
        with open(gen_path) as f:
            gen_cfg = json.load(f)
    return ModelConfig.from_hf_config(cfg, gen_cfg)


def safetensors_files(model_dir: str) -> list[str]:
    """The shards to read. With an index, exactly the files it names: some repos also
    carry a `consolidated.safetensors` in another naming scheme (Mistral)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not names:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return [os.path.join(model_dir, n) for n in names]


def iter_hf_weights(model_dir: str, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, CPU tensor cast to `dtype`) for every tensor of every shard; one tensor
    alive at a time (the caller copies it into place before asking for the next)."""
    for path in safetensors_files(model_dir):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name).to(dtype)
