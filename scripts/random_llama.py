"""Write a random-weight Llama checkpoint (config.json + model.safetensors + a word-level
tokenizer) of a named shape, for benchmarks on machines that cannot download weights.

    python scripts/random_llama.py --preset llama-1b --out /tmp/llama1b [--device cuda]
    python scripts/random_llama.py --preset smollm2-135m --num-layers 6 --out /tmp/smol6

Throughput depends on the shapes, not the values: `smollm2-135m` has the default
model's shapes (its GGUF is too large to carry to the GPU machine), `llama-1b` those of
Llama-3.2-1B. Weights are N(0, 0.02) (norm weights 1), generated on --device in the
checkpoint dtype, so a 1B model takes seconds on a GPU. `--num-layers` keeps a preset's
width (hidden size, heads, vocabulary) with fewer or more layers: a CPU benchmark at the
default model's width in a fraction of its time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool
    rope_theta: float
    max_position_embeddings: int = 8192


PRESETS = {
    "tiny": LlamaShape(256, 64, 128, 2, 4, 2, False, 10000.0, 512),
    "smollm2-135m": LlamaShape(49152, 576, 1536, 30, 9, 3, True, 100000.0),
    "llama-1b": LlamaShape(128256, 2048, 8192, 16, 32, 8, True, 500000.0),
}


def write_random_llama(out: str, shape: LlamaShape, dtype: torch.dtype, device: str,
                       seed: int = 0) -> int:
    """Write the checkpoint; returns its parameter count."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import make_tiny_tokenizer_files

    os.makedirs(out, exist_ok=True)
    cfg = LlamaConfig(**asdict(shape), bos_token_id=1, eos_token_id=2, torch_dtype=str(dtype).split(".")[-1])
    with torch.device("meta"):
        names_shapes = [(n, tuple(p.shape)) for n, p in LlamaForCausalLM(cfg).named_parameters()]
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors, count = {}, 0
    for name, shp in names_shapes:
        if name.endswith("norm.weight"):
            t = torch.ones(shp, dtype=dtype, device=device)
        else:
            t = (torch.randn(shp, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)
        tensors[name] = t.cpu().contiguous()
        count += t.numel()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    make_tiny_tokenizer_files(out, shape.vocab_size)
    return count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num-layers", type=int, default=None,
                   help="Override the preset's num_hidden_layers (its width stays).")
    args = p.parse_args(argv)
    shape = PRESETS[args.preset]
    if args.num_layers is not None:
        if args.num_layers < 1:
            p.error("--num-layers must be >= 1")
        shape = replace(shape, num_hidden_layers=args.num_layers)
    torch.set_num_threads(os.cpu_count() or 1)  # tests.conftest caps it for the test suite
    t0 = time.perf_counter()
    n = write_random_llama(args.out, shape, getattr(torch, args.dtype), args.device)
    print(json.dumps({"preset": args.preset, "num_layers": shape.num_hidden_layers,
                      "out": args.out, "params": n,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
