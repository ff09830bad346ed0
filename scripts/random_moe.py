"""Write a small random-weight Qwen3-MoE checkpoint (config.json + safetensors + a
word-level tokenizer) for the MoE benchmark, with transformers' own model class.

    python scripts/random_moe.py --out /tmp/tiny-moe

Shape ("tiny-moe"): vocab 4096, hidden 256, 4 layers, 4 Q / 2 KV heads of 64, 8 experts
of 256 intermediate features, top-2 renormalized. Weights N(0, 0.02), norms 1.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_tiny_moe(out: str, seed: int = 0) -> int:
    """Write the checkpoint; returns its parameter count."""
    import transformers

    from tests.conftest import make_tiny_tokenizer_files

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True,
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.02)
    model.save_pretrained(out)
    make_tiny_tokenizer_files(out, cfg.vocab_size)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    n = write_tiny_moe(args.out)
    print(f"wrote {args.out}: {n / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
