"""`radixlm memory`: print the memory plan for a model on a device, without loading weights.

    radixlm memory --model PATH --device-memory 141GiB [--dtype bfloat16] [--quantization fp8]
                   [--kv-cache-dtype fp8_e4m3] [--tp-size N] [--mem-fraction-static F]
                   [--chunked-prefill-size N] [--max-running-requests N] [--context-length N]
                   [--json]

PATH is a HF directory (config.json only: weights from the architecture; with
*.safetensors: their real tensor shapes) or a .gguf file (its tensor table). The device is
a GPU of --device-memory (all of it available) unless --device cpu; without
--device-memory it is the local device, probed as the engine would (after weights).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from radixlm.planning.dtype_sizes import DTYPE_BYTES, KV_CACHE_DTYPE_BYTES, QUANTIZATIONS
from radixlm.planning.units import parse_size

if TYPE_CHECKING:
    from radixlm.planning.device_memory import DeviceMemory
    from radixlm.planning.planner import MemoryPlan
    from radixlm.planning.weight_estimate import WeightEstimate

# The planner (model configs, torch) is imported by the command, not with its parser:
# every `radixlm` command builds the parser, `serve` included (planning/dtype_sizes.py).


def add_memory_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("memory", help="Plan the three memory pools for a model on a "
                              "device, without loading it.")
    p.add_argument("--model", default=None, help="HF directory (config.json is enough) or "
                   ".gguf file. Default: the default model.")
    p.add_argument("--device-memory", default=None, help="Device size, e.g. 80GB, 141GB, "
                   "24GiB. Default: probe the local device.")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: cuda when --device-memory is given or a GPU is present.")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPE_BYTES],
                   help="Run dtype of weights and activations (auto: as the engine picks: "
                   "bfloat16 on cuda and on CPUs with AMX-BF16/AVX512-BF16, else float32).")
    p.add_argument("--quantization", default="auto", choices=["auto", *QUANTIZATIONS],
                   help="auto: as the engine's --quantization auto (a GGUF's Q4_0/Q4_1 "
                   "projections keep an int4 form on a bfloat16 CPU run); int4: that, on any "
                   "device; fp8: 1-byte linear weights (planning only).")
    p.add_argument("--int4-int8-activations", action="store_true",
                   help="As the engine's flag: in a float32 run the int4 layers keep no "
                   "dense copy.")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPE_BYTES])
    p.add_argument("--tp-size", type=int, default=1, help="Tensor-parallel ranks; sizes "
                   "are per rank.")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=8192)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--attention-backend", default="torch", choices=["torch", "triton"],
                   help="Decode work space: torch gathers K/V, triton reads the pool in place.")
    p.add_argument("--enable-hierarchical-cache", action="store_true",
                   help="Show the hierarchical cache's tiers below the KV pool.")
    p.add_argument("--hicache-storage-size", default="8GiB", help="Its storage tier's bound.")
    p.add_argument("--hicache-ratio", type=float, default=None, help="Its host tier as a "
                   "multiple of the KV pool (default: 2.0 on cuda, none on cpu).")
    p.add_argument("--hicache-size", type=float, default=0, help="Its host tier in GB "
                   "(overrides --hicache-ratio).")
    p.add_argument("--json", action="store_true", help="Print the plan as JSON.")
    p.set_defaults(func=run_memory_command)


def _device(ns: argparse.Namespace, weight_bytes: int) -> DeviceMemory:
    from radixlm.planning.device_memory import DeviceMemory

    kind = ns.device
    if ns.device_memory is not None:
        total = parse_size(ns.device_memory)
        kind = "cuda" if kind == "auto" else kind
        return DeviceMemory(kind, total, total - weight_bytes, "--device-memory")
    import torch

    from radixlm.runtime.device import resolve_device

    if resolve_device(kind).type == "cuda":  # the weights are not loaded: they must fit yet
        free, total = torch.cuda.mem_get_info()
        return DeviceMemory("cuda", total, free - weight_bytes, "torch.cuda.mem_get_info")
    import psutil

    available = psutil.virtual_memory().available
    return DeviceMemory("cpu", available, available - weight_bytes, "available host memory now")


def build_plan(ns: argparse.Namespace) -> tuple[MemoryPlan, WeightEstimate]:
    from radixlm.models import resolve_model_path
    from radixlm.models.loader import load_model_config
    from radixlm.planning.planner import (default_chunked_prefill_size,
                                          default_max_total_tokens, plan_memory)
    from radixlm.planning.weight_estimate import (checkpoint_shapes, estimate_weights,
                                                  gguf_int4_tensors, gguf_int8_tensors)

    path = resolve_model_path(ns.model)
    cfg = load_model_config(path)
    shapes, source, stored = checkpoint_shapes(path, cfg)
    kind_guess = "cuda" if ns.device_memory is not None and ns.device != "cpu" else ns.device
    if kind_guess == "auto":
        import torch

        kind_guess = "cuda" if torch.cuda.is_available() else "cpu"
    import torch

    from radixlm.runtime.device import resolve_dtype
    from radixlm.models.linear import LinearPolicy
    from radixlm.models.linear.method import onednn_prepack_available

    device_guess = torch.device(kind_guess)
    torch_dtype = resolve_dtype(ns.dtype, device_guess)  # auto: as the engine picks
    dtype = str(torch_dtype).removeprefix("torch.")
    act_bytes = DTYPE_BYTES[dtype]
    kv_bytes = act_bytes if ns.kv_cache_dtype == "auto" else KV_CACHE_DTYPE_BYTES[ns.kv_cache_dtype]
    quant = ns.quantization
    if quant == "auto":  # as the engine's policy decides
        quant = "int4" if LinearPolicy("auto").keeps_int4(torch_dtype, device_guess) else "none"
    int4_names = gguf_int4_tensors(path) if quant == "int4" and path.endswith(".gguf") \
        else frozenset()
    weights = estimate_weights(shapes, cfg, act_bytes, quant, ns.tp_size, source, stored,
                               int4_names, dtype,
                               prepacked_head=onednn_prepack_available(torch_dtype, device_guess),
                               int8_forms=(gguf_int8_tensors(path, dtype == "float32")
                                           if quant == "int4"
                                           and path.endswith(".gguf") else None),
                               int4_int8_activations=ns.int4_int8_activations)
    device = _device(ns, weights.total_bytes)
    context_len = min(cfg.max_position_embeddings, ns.context_length or 1 << 30,
                      cfg.context_cap or 1 << 30)
    chunk = ns.chunked_prefill_size
    if chunk is None:
        chunk = default_chunked_prefill_size(device.kind, device.total_bytes)
    cap = ns.max_total_tokens if ns.max_total_tokens is not None else \
        default_max_total_tokens(device.kind)
    plan = plan_memory(cfg=cfg, weight_bytes=weights.total_bytes, device=device,
                       act_bytes=act_bytes, kv_bytes=kv_bytes, context_len=context_len,
                       chunked_prefill_size=chunk, max_prefill_tokens=ns.max_prefill_tokens,
                       page_size=ns.page_size, tp_size=ns.tp_size,
                       mem_fraction_static=ns.mem_fraction_static,
                       max_running_requests=ns.max_running_requests, max_total_tokens=cap,
                       attention_backend=ns.attention_backend, weight_formats=weights.formats)
    return plan, weights


def run_memory_command(ns: argparse.Namespace) -> None:
    from radixlm.model_path import ModelNotFoundError
    from radixlm.planning.plan_report import plan_json, plan_table, verdict

    try:
        plan, weights = build_plan(ns)
    except (ModelNotFoundError, ValueError) as e:
        print(f"radixlm memory: {e}", file=sys.stderr)
        sys.exit(2)
    tiers = None
    if ns.enable_hierarchical_cache:
        from radixlm.planning.tier_plan import TierPlan, host_tier_bytes

        try:
            host = host_tier_bytes(ns.hicache_size, ns.hicache_ratio, plan.kv_bytes,
                                   plan.device_kind)
        except ValueError as e:
            print(f"radixlm memory: {e}", file=sys.stderr)
            sys.exit(2)
        tiers = TierPlan(plan.kv_bytes_per_token, parse_size(ns.hicache_storage_size), host,
                         pinned=plan.device_kind == "cuda")
    if ns.json:
        body = plan_json(plan, weights)
        if tiers is not None:
            body["hicache_tiers"] = tiers.as_dict()
        print(json.dumps(body, indent=2))
    else:
        print(plan_table(plan, weights))
        for line in verdict(plan):
            print(line)
        for line in tiers.lines(plan.kv_tokens) if tiers is not None else []:
            print(line)
    if plan.fatal:
        sys.exit(1)
