"""Out-of-memory diagnosis: which pool ran out, in which phase, and which flag to change.

The method (MISSION.md item 8), applied with the plan's numbers:
  * OOM in prefill (EXTEND or MIXED): the activation pool is short for the chunk. Lower
    --chunked-prefill-size (to the largest chunk that fits) and/or lower
    --mem-fraction-static (to the fraction whose activation pool holds the batch).
  * OOM in decode: the activation peak of decoding the whole running batch (the torch
    backend gathers every request's K/V) is short: fewer concurrent requests
    (--max-running-requests, to the batch that fits), or re-balance the pools
    (lower --mem-fraction-static).
  * KV pool exhausted in decode with nothing left to retract: the KV pool is short: raise
    --mem-fraction-static (the share for weights + KV; up, not down), or fewer requests.
  * The hicache's host tier (plan.host_tier_bytes) is RAM: on CUDA it cannot help a
    device OOM (said so); on the CPU it is the activations' RAM, so lowering it is a fix.
Every number in the message comes from the MemoryPlan and the failed batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.planning.activation_guard import ActivationBudgetExceeded
from radixlm.planning.planner import MemoryPlan
from radixlm.planning.units import fmt_bytes

# Messages of allocation failures that are not a torch.OutOfMemoryError (CPU allocators).
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "not enough memory")


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA OOM, the CPU activation budget, or a failed host allocation."""
    if isinstance(error, (torch.OutOfMemoryError, ActivationBudgetExceeded, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error).lower() for m in _OOM_MESSAGES)


@dataclass(frozen=True)
class BatchShape:
    """What the failed batch computed: request i extends extend_lens[i] tokens and attends
    over seq_lens[i] (decode: extend 1 each)."""

    phase: str  # "prefill" | "decode"
    extend_lens: list[int]
    seq_lens: list[int]

    @property
    def tokens(self) -> int:
        return sum(self.extend_lens)

    @property
    def requests(self) -> int:
        return len(self.extend_lens)

    @property
    def max_len(self) -> int:
        return max(self.seq_lens, default=0)


@dataclass(frozen=True)
class OOMDiagnosis:
    phase: str  # "prefill" | "decode"
    pool: str  # "activation" | "kv"
    cause: str  # what raised, e.g. "torch.OutOfMemoryError", "activation budget"
    shape: BatchShape
    need_bytes: int  # the batch's activation estimate (or the budget error's figure)
    pool_bytes: int  # the activation pool (headroom) or the KV pool bytes
    fixes: list[str] = field(default_factory=list)
    # The largest prefill chunk / decode batch that fits the activation pool (0: none).
    fitting_chunk: int = 0
    fitting_batch: int = 0
    note: str = ""  # the host tier's part (host_tier_note)

    def message(self) -> str:
        s = self.shape
        if self.pool == "kv":
            what = (f"Out of memory in {self.phase}: the KV cache pool is short. "
                    f"{s.requests} running requests (the longest at {s.max_len} tokens) do "
                    f"not fit its {fmt_bytes(self.pool_bytes)}.")
        else:
            batch = (f"a prefill of {s.tokens} tokens in {s.requests} requests (attending over "
                     f"up to {s.max_len})" if self.phase == "prefill" else
                     f"a decode step of {s.requests} requests (the longest at {s.max_len} tokens)")
            what = (f"Out of memory in {self.phase} ({self.cause}): the activation pool is "
                    f"short. {batch[0].upper() + batch[1:]} needs about "
                    f"{fmt_bytes(self.need_bytes)} of activation memory; the activation pool "
                    f"has {fmt_bytes(self.pool_bytes)}.")
        return (what + (" Fix: " + "; or ".join(self.fixes) + "." if self.fixes else "")
                + (" " + self.note if self.note else ""))


def host_tier_note(plan: MemoryPlan) -> tuple[str, str]:
    """(a fix, a note) about the hierarchical cache's host tier: it costs RAM, not device
    memory. On the CPU backend that RAM is the device's: a smaller host tier is a fix."""
    host = plan.host_tier_bytes
    if not host:
        return "", ""
    if plan.device_kind == "cpu":
        return (f"lower --hicache-ratio / --hicache-size (its host tier takes "
                f"{fmt_bytes(host)} of the same RAM)"), ""
    return "", (f"(The hierarchical cache's host tier, {fmt_bytes(host)}, is host RAM, not "
                "device memory: a bigger or smaller --hicache-ratio / --hicache-size does "
                "not change this.)")


def diagnose_oom(plan: MemoryPlan, shape: BatchShape, error: BaseException | None = None,
                 chunked_prefill_size: int | None = None,
                 max_running_requests: int | None = None) -> OOMDiagnosis:
    """The diagnosis of an activation OOM of a batch of `shape` (see the module docstring)."""
    act = plan.activation
    headroom = plan.activation_headroom
    if isinstance(error, ActivationBudgetExceeded):
        need, headroom, cause = error.need, error.budget, "activation budget"
    elif shape.phase == "prefill":
        need, cause = act.extend_bytes(shape.extend_lens, shape.seq_lens), _name(error)
    else:
        need, cause = act.decode_bytes(shape.requests, shape.max_len), _name(error)
    f_fit = plan.fraction_for_headroom(need)
    fixes: list[str] = []
    chunk = batch = 0
    if shape.phase == "prefill":
        # Chunks of these requests attend over at most their longest sequence.
        chunk = act.max_chunk_within(headroom, max(shape.max_len, 1), plan.page_size)
        current = chunked_prefill_size if chunked_prefill_size is not None else plan.prefill_chunk
        if chunk and (current <= 0 or chunk < current):
            fixes.append(f"lower --chunked-prefill-size to {chunk}"
                         + (" (now off)" if current <= 0 else f" (now {current})"))
    else:
        batch = act.max_decode_batch_within(headroom, shape.max_len, shape.requests)
        if batch:
            fixes.append(f"lower --max-running-requests to {batch} (now "
                         f"{max_running_requests or plan.max_running_requests})")
    if f_fit is not None and f_fit < plan.mem_fraction_static:
        fixes.append(f"lower --mem-fraction-static to {f_fit:.2f} (now "
                     f"{plan.mem_fraction_static:.2f}; each -0.01 moves "
                     f"{fmt_bytes(0.01 * plan.device_total)} from the KV pool to activations)")
    elif plan.kv_limited_by != "memory" and need > headroom:
        give = need - headroom
        tokens = max(plan.page_size, plan.kv_tokens - -(-give // plan.kv_bytes_per_token))
        fixes.append(f"lower --max-total-tokens to {tokens} (now {plan.kv_tokens})")
    host_fix, note = host_tier_note(plan)
    fixes += [host_fix] if host_fix else []
    return OOMDiagnosis(shape.phase, "activation", cause, shape, need, headroom, fixes,
                        fitting_chunk=chunk, fitting_batch=batch, note=note)


def diagnose_kv_exhaustion(plan: MemoryPlan, shape: BatchShape) -> OOMDiagnosis:
    """Decode found no free KV slot and nothing left to retract: the KV pool is short."""
    want = sum(shape.seq_lens) + shape.requests
    f_need = plan.fraction_for_kv_tokens(want) if plan.kv_limited_by == "memory" else None
    fixes = []
    if f_need is not None:
        fixes.append(f"raise --mem-fraction-static to {f_need:.2f} (now "
                     f"{plan.mem_fraction_static:.2f}; it is the share for weights + KV)")
    elif plan.kv_limited_by != "memory":
        fixes.append(f"raise --max-total-tokens above {want} (now {plan.kv_tokens})")
    if shape.requests > 1:
        fixes.append(f"lower --max-running-requests below {shape.requests}")
    note = ""
    if plan.host_tier_bytes:  # running requests' K/V lives in the device pool only
        note = (f"(The hierarchical cache's host tier, {fmt_bytes(plan.host_tier_bytes)} of "
                "host RAM, holds only cached prefixes, never running requests' K/V: a bigger "
                "one does not help this.)")
    return OOMDiagnosis("decode", "kv", "KV pool exhausted", shape, want * plan.kv_bytes_per_token,
                        plan.kv_bytes, fixes, note=note)


def _name(error: BaseException | None) -> str:
    if error is None:
        return "out of memory"
    if isinstance(error, torch.OutOfMemoryError):
        return "torch.OutOfMemoryError"
    return type(error).__name__
