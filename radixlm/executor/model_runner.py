"""ModelRunner: owns the model, the pools and the attention backend; runs forwards.

It loads the weights, sizes and allocates `req_to_token_pool` and `token_to_kv_pool`
(for now from --max-total-tokens, rounded down to whole --page-size pages; the memory
planner comes later), and turns a ForwardBatch into logits and a SamplingBatchInfo into
sampled tokens.
"""

from __future__ import annotations

import logging
import time

import torch

from radixlm.attention import create_attention_backend
from radixlm.config import ServerArgs
from radixlm.executor.forward_batch import ForwardBatch
from radixlm.executor.sampler import SampleOutput, Sampler, SamplingBatchInfo
from radixlm.mem import KVSlotAllocator, ReqToTokenPool, TokenToKVPool
from radixlm.models import ModelConfig, load_model

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but torch sees no CUDA device")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA; float32 on CPU, where it measured fastest for the default
    model on CPUs without AVX-512 BF16/AMX (docs/benchmarks.md, "dtype on the CPU")."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def resolve_chunked_prefill_size(value: int | None, device: torch.device) -> int:
    """None: a default by device. On the CPU compute, not memory, is the limit: 1024
    tokens keep one chunk of the default model near a second. On CUDA, bigger devices take
    bigger chunks (more activation headroom), as SGLang's defaults do."""
    if value is not None:
        return value
    if device.type != "cuda":
        return 1024
    total_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    return 2048 if total_gib < 24 else 4096 if total_gib < 80 else 8192


class ModelRunner:
    def __init__(self, args: ServerArgs, model_path: str) -> None:
        self.args = args
        self.device = resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, self.device)
        t0 = time.perf_counter()
        self.model, self.model_config = load_model(model_path, self.dtype, self.device)
        logger.info("loaded %s (%s, %s) in %.1f s", model_path, self.dtype, self.device,
                    time.perf_counter() - t0)
        cfg: ModelConfig = self.model_config
        # Sliding-window attention is not implemented: full attention equals it only while
        # a sequence fits in the window, so the window caps the context.
        self.context_len = min(cfg.max_position_embeddings, args.context_length or 1 << 30,
                               cfg.sliding_window or 1 << 30)
        if args.page_size < 1 or args.page_size > args.max_total_tokens:
            raise ValueError(f"--page-size must be between 1 and --max-total-tokens "
                             f"({args.max_total_tokens}), got {args.page_size}")
        self.page_size = args.page_size
        # The allocator hands out whole pages: the pool is rounded down to a page multiple.
        self.max_total_tokens = args.max_total_tokens // args.page_size * args.page_size
        self.max_running_requests = args.max_running_requests
        self.chunked_prefill_size = resolve_chunked_prefill_size(args.chunked_prefill_size, self.device)
        self.req_to_token_pool = ReqToTokenPool(self.max_running_requests, self.context_len, self.device)
        self.token_to_kv_pool = TokenToKVPool(self.max_total_tokens, cfg.num_layers, cfg.num_kv_heads,
                                              cfg.head_dim, self.dtype, self.device)
        self.allocator = KVSlotAllocator(self.max_total_tokens, self.device, self.page_size)
        self.attn_backend = create_attention_backend("torch")
        self.sampler = Sampler()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        fb.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, info: SamplingBatchInfo) -> SampleOutput:
        return self.sampler(logits, info)
