"""ModelRunner: owns the model, the pools and the attention backend; runs forwards.

It loads the weights, then builds the MemoryPlan (`planning/planner.py`: weights, KV pool,
activations, from the measured weight bytes and the device's memory) and allocates exactly
what it says (`mem/pools.py` `build_pools(plan)`: the one Pools object the scheduler
shares): `plan.kv_tokens` KV slots (--max-total-tokens is a cap) and
`plan.max_running_requests` req_to_token rows. A plan that cannot work
refuses the start (`MemoryPlanError`, with the flag to change). It turns a ForwardBatch
into logits (decode batches run graphs made at start, `decode_graph_runner.py`: captured
CUDA graphs on CUDA, torch.compile'd graphs on the CPU with --enable-torch-compile) and a SamplingBatchInfo into sampled tokens. On the CPU it holds the
activation budget (`activation_guard`), which the scheduler checks before it launches a
batch (`scheduler/oom_recovery.py`).
"""

from __future__ import annotations

import logging
import time

import torch

from radixlm.attention import create_attention_backend
from radixlm.attention.base import AttentionBackend
from radixlm.attention.batch_invariant_backend import BatchInvariantAttentionBackend
from radixlm.config import ServerArgs
from radixlm.cpu_kernels.build import load_all_kernels
from radixlm.executor.compiled_graph import compiled_graph_factory
from radixlm.executor.decode_graph_runner import DecodeGraphRunner, capture_batch_sizes
from radixlm.forward_batch import ForwardBatch
from radixlm.executor.sampler import SampleOutput, Sampler, SamplingBatchInfo
from radixlm.mem.pools import build_pools
from radixlm.planning.activation_guard import ActivationGuard
from radixlm.planning.device_memory import probe_device_memory
from radixlm.planning.dtype_sizes import DTYPE_BYTES
from radixlm.planning.plan_report import plan_table
from radixlm.planning.planner import (MemoryPlan, default_chunked_prefill_size,
                                      default_max_total_tokens, plan_memory)
from radixlm.planning.units import parse_size
from radixlm.planning.weight_estimate import kv_heads_per_rank, module_bytes
from radixlm.models import ModelConfig, load_model
from radixlm.models.batch_invariant import BatchInvariantOps
from radixlm.models.linear import LinearPolicy, weight_bytes_by_format
from radixlm.models.parallel_context import SINGLE, ParallelContext
from radixlm.runtime.device import choose_dtype, resolve_device, resolve_kv_cache_dtype
from radixlm.runtime.host_malloc import collapse_to_huge_pages

logger = logging.getLogger(__name__)

def resolve_chunked_prefill_size(value: int | None, device: torch.device) -> int:
    """None: a default by device (`planner.default_chunked_prefill_size`)."""
    if value is not None:
        return value
    total = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
             else 0)
    return default_chunked_prefill_size(device.type, total)


class MemoryPlanError(ValueError):
    """The memory plan cannot work; the message says why and which flag to change."""


# models/moe.py reads each expert's token count on the host: no graph can hold that.
_MOE_NO_GRAPHS = "the MoE layers group tokens by expert on the host"


class ModelRunner:
    def __init__(self, args: ServerArgs, model_path: str, ctx: ParallelContext = SINGLE) -> None:
        """`ctx`: this process's tensor-parallel rank (runtime/distributed.py); the model
        and the KV pool hold only that rank's heads."""
        if args.tp_size != ctx.tp_size:
            raise ValueError(f"--tp-size {args.tp_size} needs one process per rank "
                             f"(radixlm serve); this runner is rank {ctx.tp_rank} of {ctx.tp_size}")
        self.args = args
        self.ctx = ctx
        self.device = resolve_device(args.device)
        if self.device.type == "cuda" and ctx.is_parallel:
            # This rank's GPU (set by init_tensor_parallel), named explicitly: the current
            # device is per thread, and the forward thread starts on cuda:0.
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cpu":
            load_all_kernels()  # a first start on this CPU builds them here, not in a request
        self.dtype, self.dtype_reason = choose_dtype(args.dtype, self.device)
        logger.info("dtype %s -> %s (%s)", args.dtype, str(self.dtype).removeprefix("torch."),
                    self.dtype_reason)
        t0 = time.perf_counter()
        self.linear_policy = LinearPolicy(
            quantization=args.quantization, prepack=not args.disable_weight_prepack,
            int4_int8_activations=args.int4_int8_activations,
            # Deterministic inference: every GEMM on fixed row tiles (docs/deterministic.md);
            # no quantized kernels (they switch by batch size).
            gemm=BatchInvariantOps().linear if args.enable_deterministic_inference else None)
        self.model, self.model_config = load_model(model_path, self.dtype, self.device, ctx=ctx,
                                                   linear_policy=self.linear_policy)
        self.weight_formats = weight_bytes_by_format(self.model)
        logger.info("loaded %s (%s, %s) in %.1f s", model_path, self.dtype, self.device,
                    time.perf_counter() - t0)
        self.huge_page_bytes = 0
        if self.device.type == "cpu":  # fewer TLB misses per weight read (host_malloc.py)
            t1 = time.perf_counter()
            self.huge_page_bytes = collapse_to_huge_pages(
                [*self.model.parameters(), *self.model.buffers()])
            logger.info("weights on huge pages: %.0f MB in %.2f s", self.huge_page_bytes / 1e6,
                        time.perf_counter() - t1)
        cfg: ModelConfig = self.model_config
        # A sliding window the model's layers do not apply (Mistral): full attention equals
        # it only while a sequence fits in the window, so the window caps the context.
        self.context_len = min(cfg.max_position_embeddings, args.context_length or 1 << 30,
                               cfg.context_cap or 1 << 30)
        cap = (args.max_total_tokens if args.max_total_tokens is not None
               else default_max_total_tokens(self.device.type))
        if args.page_size < 1 or (cap is not None and args.page_size > cap):
            raise ValueError(f"--page-size must be between 1 and --max-total-tokens "
                             f"({cap}), got {args.page_size}")
        self.page_size = args.page_size
        self.chunked_prefill_size = resolve_chunked_prefill_size(args.chunked_prefill_size, self.device)
        self.kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, self.dtype)
        self.plan = self._plan(args, cap)
        # The allocator hands out whole pages: the plan's pool is a page multiple.
        self.max_total_tokens = self.plan.kv_tokens
        self.max_running_requests = self.plan.max_running_requests
        # The one pools object the scheduler shares. Per rank: only the KV heads of the
        # rank's Q heads (split or replicated).
        self.pools = build_pools(self.plan, num_layers=cfg.num_layers,
                                 kv_heads=kv_heads_per_rank(cfg, ctx.tp_size),
                                 head_dim=cfg.head_dim, kv_dtype=self.kv_dtype, device=self.device)
        self.req_to_token_pool = self.pools.req_to_token_pool
        self.token_to_kv_pool = self.pools.token_to_kv_pool
        self.allocator = self.pools.allocator
        self.attn_backend = self.new_attention_backend()
        self.sampler = Sampler(deterministic=args.enable_deterministic_inference)
        # The CPU's out-of-memory: the planned activation pool as a budget (CUDA raises
        # torch.OutOfMemoryError by itself).
        self.activation_guard = (ActivationGuard(self.plan.activation, self.plan.activation_headroom)
                                 if self.device.type == "cpu" else None)
        self.decode_graphs = (self._cuda_graphs(args) if self.device.type == "cuda"
                              else self._compiled_graphs(args))

    def new_attention_backend(self) -> AttentionBackend:
        """An attention backend for this runner's forwards. A backend keeps the metadata of
        the forward it last prepared: a forward running beside another (a background graph
        capture beside the eager steps) needs one of its own."""
        args, cfg = self.args, self.model_config
        if args.enable_deterministic_inference:
            # Batch-invariant attention and draws (the GEMMs: linear_policy above).
            return BatchInvariantAttentionBackend()
        return create_attention_backend(
            args.attention_backend, self.device,
            sliding_window=cfg.sliding_layers is not None and any(cfg.sliding_layers))

    def _compiled_graphs(self, args: ServerArgs) -> DecodeGraphRunner | None:
        """torch.compile the decode forward per batch size (--enable-torch-compile), or say
        why not."""
        if not args.enable_torch_compile:
            return None
        if not self.attn_backend.supports_decode_graphs:
            logger.warning("--enable-torch-compile ignored: the %s attention backend reads "
                           "host values in decode (the torch backend needs its C++ decode "
                           "kernel, which did not build)", type(self.attn_backend).__name__)
            return None
        if self.model_config.num_experts:
            logger.warning("--enable-torch-compile ignored: %s", _MOE_NO_GRAPHS)
            return None
        sizes = capture_batch_sizes(min(args.torch_compile_max_bs, self.max_running_requests))
        # Tensor-parallel ranks must pick graph or eager alike at every step: they compile
        # before serving.
        background = args.torch_compile_background and not self.ctx.is_parallel
        return DecodeGraphRunner(self, sizes, compiled_graph_factory(len(sizes)),
                                 kind="torch.compile graphs", background=background)

    def _cuda_graphs(self, args: ServerArgs) -> DecodeGraphRunner | None:
        """Capture the decode CUDA graphs, or say why not."""
        if args.disable_cuda_graph:
            return None
        if not self.attn_backend.supports_decode_graphs:
            logger.info("CUDA graphs off: the %s attention backend does not support them "
                        "(--attention-backend triton does)", type(self.attn_backend).__name__)
            return None
        if self.model_config.num_experts:
            logger.info("CUDA graphs off: %s", _MOE_NO_GRAPHS)
            return None
        max_bs = min(args.cuda_graph_max_bs, self.max_running_requests)
        try:
            return DecodeGraphRunner(self, capture_batch_sizes(max_bs))
        except torch.OutOfMemoryError as e:
            raise MemoryPlanError(
                f"out of memory capturing the decode CUDA graphs (batches up to {max_bs}; "
                f"they take one decode step's activations from the activation pool of "
                f"{self.plan.activation_headroom / 2**20:.0f} MiB): {e}. Fix: lower "
                f"--cuda-graph-max-bs, or lower --mem-fraction-static, or "
                f"--disable-cuda-graph") from None

    def _plan(self, args: ServerArgs, cap: int | None) -> MemoryPlan:
        """The three pools from the loaded weights and the device; log them; refuse to go
        on when the plan cannot work."""
        weights = module_bytes(self.model)
        budget = parse_size(args.device_memory) if args.device_memory else None
        device_mem = probe_device_memory(self.device, weights, budget)
        itemsize = torch.empty((), dtype=self.kv_dtype).element_size()
        plan = plan_memory(cfg=self.model_config, weight_bytes=weights, device=device_mem,
                           act_bytes=DTYPE_BYTES[str(self.dtype).removeprefix("torch.")],
                           kv_bytes=itemsize, context_len=self.context_len,
                           chunked_prefill_size=self.chunked_prefill_size,
                           max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size,
                           mem_fraction_static=args.mem_fraction_static,
                           max_running_requests=args.max_running_requests, max_total_tokens=cap,
                           tp_size=self.ctx.tp_size, weight_formats=self.weight_formats)
        if self.ctx.is_parallel:
            # Every rank must size its pools alike (the schedulers' identical decisions
            # rest on it), but each probes its own free memory: rank 0's plan is used.
            box = [plan]
            torch.distributed.broadcast_object_list(box, src=0, group=self.ctx.cpu_group)
            plan = box[0]
        logger.info("%s", plan_table(plan))
        for problem in plan.problems:
            if not problem.fatal:
                logger.warning("memory plan: %s", problem.text())
        if plan.fatal:
            raise MemoryPlanError("the memory plan cannot work: "
                                  + " ".join(p.text() for p in plan.fatal))
        return plan

    @property
    def cuda_graph_batch_sizes(self) -> list[int] | None:
        graphs = self.decode_graphs
        return graphs.batch_sizes if graphs and self.device.type == "cuda" else None

    @property
    def torch_compile_batch_sizes(self) -> list[int] | None:
        graphs = self.decode_graphs
        return graphs.batch_sizes if graphs and self.device.type != "cuda" else None

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """The batch's logits: a decode graph's run for the decode batches it covers, else
        the eager forward."""
        if self.device.index is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the forward thread's current device
        graphs = self.decode_graphs
        if graphs is not None and graphs.can_run(fb):
            return graphs.replay(fb)
        return self.run_model(fb)

    def run_model(self, fb: ForwardBatch,
                  attn_backend: AttentionBackend | None = None) -> torch.Tensor:
        """The eager forward (also what the decode graphs capture). Callers hold inference
        mode (`forward`, the graph runner's capture): entering it here would put the
        entry into the compiled graphs, which AOTAutograd's cache refuses. `attn_backend`:
        one of `new_attention_backend`'s (default: the runner's own)."""
        backend = attn_backend or self.attn_backend
        fb.attn_backend = backend
        backend.init_forward_metadata(fb)
        return self.model(fb)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, info: SamplingBatchInfo) -> SampleOutput:
        return self.sampler(logits, info)
