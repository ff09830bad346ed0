"""Device and dtype choice: --device, --dtype, --kv-cache-dtype as the engine resolves them
(docs/request-path.md, "Processes")."""

from __future__ import annotations

import torch

from radixlm.planning.planner import ENGINE_KV_CACHE_DTYPES
from radixlm.runtime import cpu_features

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but torch sees no CUDA device")
    return torch.device(name)


def choose_dtype(name: str, device: torch.device) -> tuple[torch.dtype, str]:
    """The run dtype for --dtype `name` and why. auto: bfloat16 on CUDA; on the CPU
    bfloat16 when it has native bf16 dot products (AMX-BF16 or AVX512-BF16), else float32,
    which measured fastest there without them (docs/benchmarks.md, "dtype on the CPU")."""
    if name != "auto":
        return _DTYPES[name], "given by --dtype"
    if device.type == "cuda":
        return torch.bfloat16, "CUDA"
    fast = cpu_features.fast_bf16_flags()
    if fast:
        return torch.bfloat16, f"CPU has {' and '.join(fast)}"
    return torch.float32, "CPU has neither amx_bf16 nor avx512_bf16"


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    return choose_dtype(name, device)[0]


def resolve_kv_cache_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """auto: the run dtype. fp8 KV is planned (`radixlm memory`) but not stored yet."""
    if name not in ENGINE_KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {name} is planning-only for now (radixlm memory); "
                         f"the engine stores KV in one of {', '.join(ENGINE_KV_CACHE_DTYPES)}")
    return dtype if name == "auto" else _DTYPES[name]
