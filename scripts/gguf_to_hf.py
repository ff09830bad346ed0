#!/usr/bin/env python3
"""Write a GGUF model as a Hugging Face directory (bfloat16 safetensors, its tokenizer), for
peers that read only that format (vLLM's CPU backend in scripts/bench_peers.sh). The
values are the GGUF's, dequantized by transformers: the same weights radixlm and
llama-server read.

    python scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

Needs transformers, torch, gguf (run it in the peer's venv or radixlm's).
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.utils.quantization_config import GgufConfig


def convert(gguf_path: str, out: str) -> None:
    gdir, gname = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    packed = AutoModelForCausalLM.from_pretrained(
        gdir, gguf_file=gname, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True))
    config = packed.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # A plain model from the config, with the dequantized values copied in (save_pretrained
    # refuses a quantized one); a tied LM head is the only weight allowed to be missing.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(packed.state_dict(), strict=False)
    if unexpected or not all("lm_head" in k for k in missing):
        raise SystemExit(f"weights do not match the config: missing {missing}, "
                         f"unexpected {unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    del packed
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id).save_pretrained(out)
    print(f"{type(model).__name__}, {sum(p.numel() for p in model.parameters())} parameters "
          f"-> {out}: {sorted(os.listdir(out))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf")
    p.add_argument("out")
    a = p.parse_args()
    torch.set_num_threads(1)
    convert(a.gguf, a.out)


if __name__ == "__main__":
    main()
