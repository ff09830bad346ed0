"""ForwardWorker: runs one batch's forward + sampling, inline or on a forward thread.

The zero-overhead (overlap) scheduler launches batch N+1 before it processes batch N's
results, so the device (here: the forward thread) goes from one forward straight into the
next while the scheduler thread does its CPU work (receiving requests, stop checks,
streaming, radix cache updates, building the next batch). torch releases the GIL inside
its ops, so on the CPU the two threads overlap as far as the forward's own Python allows;
on CUDA the forward thread only enqueues kernels.

Both modes run the very same `ForwardTask` on the same `ModelRunner`:
  * `inline=True` (`--disable-overlap-schedule`): `launch` runs the task at once and
    returns a finished future (the serial loop);
  * `inline=False` (default): one worker thread runs tasks in launch order.

More: docs/executor.md, "executor/forward_worker.py".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from radixlm.executor.cuda_streams import CudaTaskSync, make_streams
from radixlm.forward_batch import ForwardBatch
from radixlm.executor.forward_split import halves
from radixlm.executor.prompt_logprobs import PromptLogprobPlan, PromptLogprobTensors
from radixlm.executor.sampler import SampleOutput, SamplingBatchInfo, SamplingRow
from radixlm.executor.step_timer import StepTimer
from radixlm.planning.oom import BatchShape, diagnose_oom, is_out_of_memory

logger = logging.getLogger(__name__)

__all__ = ["ForwardTask", "ForwardWorker", "InFlight", "StepTimer", "batch_shape"]


@dataclass
class ForwardTask:
    """Everything one forward + sampling needs, captured at launch.

    `sampling_reqs` are the requests that sample a token this step (a chunk that does not
    end its prompt samples nothing); `keep` selects their rows of the logits (None: all
    rows). `rows` are their req_to_token rows, where the sampled tokens go in the relay.
    """
    forward_batch: ForwardBatch
    sampling_reqs: list[SamplingRow]
    keep: torch.Tensor | None
    rows: torch.Tensor
    # Each sampling request's seq_len after this forward: the position of the token it
    # samples (taken at launch: the Req's own lengths move on the scheduler thread).
    positions: list[int]
    # Built by `launch` when the streams stage it with the batch (CUDA; the penalty
    # counts are attached in the task); otherwise on the forward thread.
    sampling_info: SamplingBatchInfo | None = None
    # Constrained rows' token bitmask (radixlm/constrained/step_mask.py); None when no
    # row is constrained.
    grammar: Any = None
    # EXTEND: the prompt positions whose logprobs requests asked for (prompt_logprobs.py).
    prompt_logprobs: PromptLogprobPlan | None = None
    # Hand the sampled rows' logits back (SampleOutput.logits): speculative decoding's
    # rejection sampling against a draft model's distribution needs the target's.
    return_logits: bool = False


@dataclass
class InFlight:
    """A launched task: its future (the SampleOutput) and its streams' sync token."""
    future: Future
    sync: CudaTaskSync | None  # None on the CPU


class ForwardWorker:
    def __init__(self, runner, inline: bool) -> None:
        self.runner = runner
        self.inline = inline
        self.timer = StepTimer()
        # Token relay: relay[row] is the newest token sampled for the request in
        # req_to_token row `row`. A batch launched before its inputs' sampling finished
        # reads them from here on the forward thread (ForwardBatch.future_*).
        self.relay = torch.zeros(runner.req_to_token_pool.size + 1, dtype=torch.int64,
                                 device=runner.device)
        self.streams = make_streams(runner.device)
        self._pool = None if inline else ThreadPoolExecutor(1, thread_name_prefix="forward")
        # Seconds the scheduler thread spent blocked on forwards: running them (inline) or
        # waiting for their results; the rest of a step is scheduling CPU time.
        self.blocked_s = 0.0

    def launch(self, task: ForwardTask) -> InFlight:
        """Scheduler thread. Everything the scheduler wrote for the task (pools, slots) is
        ordered before it; on CUDA its host inputs are uploaded here, asynchronously."""
        reqs, info = task.sampling_reqs, task.sampling_info
        if info is None and self.streams.sampling_info_at_launch and reqs:
            # Host tensors, staged with the batch: no device sync on the forward thread.
            # The penalty counts are the forward thread's (the previous task updates them).
            info = self._sampling_info(task, torch.device("cpu"), penalty_state=False)
        (fb, info, keep, rows, plan), sync = self.streams.stage(
            [task.forward_batch, info, task.keep, task.rows, task.prompt_logprobs],
            gap_counts=self.timer.launched())
        task = dataclasses.replace(task, forward_batch=fb, sampling_info=info, keep=keep,
                                   rows=rows, prompt_logprobs=plan)
        if self._pool is not None:
            return InFlight(self._pool.submit(self._run, task, sync), sync)
        fut: Future = Future()
        t0 = time.perf_counter()
        try:
            fut.set_result(self._run(task, sync))
        except BaseException as e:  # surfaced by fut.result(), as the thread would
            fut.set_exception(e)
        self.blocked_s += time.perf_counter() - t0
        return InFlight(fut, sync)

    def _sampling_info(self, task: ForwardTask, device: torch.device,
                       penalty_state: bool) -> SamplingBatchInfo:
        return SamplingBatchInfo.from_reqs(task.sampling_reqs, self.runner.vocab_size, device,
                                           positions=task.positions, penalty_state=penalty_state,
                                           deterministic=self.runner.sampler.deterministic)

    def wait(self, launched: InFlight) -> SampleOutput | None:
        """The batch's sampled tokens, on the host (re-raises the forward's exception).
        On CUDA this is where the scheduler thread waits for the device."""
        t0 = time.perf_counter()
        try:
            out = launched.future.result()
            self.streams.finish(launched.sync, self.timer)
            return out
        finally:
            self.blocked_s += time.perf_counter() - t0

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    @torch.inference_mode()
    def _run(self, task: ForwardTask, sync: CudaTaskSync | None) -> SampleOutput | None:
        fb = task.forward_batch
        with self.streams.running(sync, self.timer, fb.forward_mode.is_decode()):
            if fb.future_token_idx is not None:
                # Inputs whose tokens were still being sampled when this batch was built.
                fb.input_ids[fb.future_token_idx] = self.relay[fb.future_token_rows]
            logits, failed, prompt_lp = self._forward_with_prompt_logprobs(fb, task.prompt_logprobs)
            if logits is None:  # every request failed: rows to sample from, thrown away
                logits = torch.zeros((fb.batch_size, self.runner.vocab_size),
                                     device=fb.input_ids.device)
            reqs = task.sampling_reqs
            if not reqs:
                if not failed and prompt_lp is None:
                    return None
                return SampleOutput(torch.empty(0, dtype=torch.int64), failed=failed or None,
                                    prompt_logprobs=prompt_lp)
            if task.keep is not None:
                logits = logits[task.keep]
            if task.grammar is not None:  # constrained rows: mask just before sampling
                task.grammar.apply(logits)
            info = task.sampling_info
            if info is None:
                info = self._sampling_info(task, self.runner.device, penalty_state=True)
            elif info.penalized_rows:
                info.attach_penalty_state(reqs)
            out = self.runner.sample(logits, info)
            self.relay[task.rows] = out.next_token_ids
            _count_penalty_tokens(reqs, out.next_token_ids)
            lp = out.logprob_tensors
            return SampleOutput(self.streams.to_host(out.next_token_ids),
                                None if lp is None else lp.map_tensors(self.streams.to_host),
                                failed or None, prompt_lp,
                                logits=logits.float() if task.return_logits else None)

    def _forward_with_prompt_logprobs(
            self, fb: ForwardBatch, plan: PromptLogprobPlan | None,
    ) -> tuple[torch.Tensor | None, dict[int, str], PromptLogprobTensors | None]:
        """`_forward`, plus the prompt logprobs of `plan` (host-bound tensors) computed from
        extra logits rows; the logits returned are the batch's own B rows. An out-of-memory
        split drops the extra rows: the planned requests then fail like an OOM'd request."""
        if plan is None:
            return (*self._forward(fb), None)
        logits, failed = self._forward(plan.with_extra_rows(fb))
        if logits is None:
            return None, failed, None
        if logits.shape[0] != fb.batch_size + plan.token_idx.shape[0]:
            lost = {i: "out of memory: the batch was split, and its prompt logprobs lost"
                    for i in plan.req_index}
            return logits[:fb.batch_size], {**lost, **failed}, None
        prompt_lp = plan.reduce(logits[fb.batch_size:]).map_tensors(self.streams.to_host)
        return logits[:fb.batch_size], failed, prompt_lp

    def _forward(self, fb: ForwardBatch) -> tuple[torch.Tensor | None, dict[int, str]]:
        """The batch's logits, and the requests that failed. Out of memory (a CUDA OOM, a
        failed host allocation): run it again as two halves by requests
        (`forward_split.py`), recursively; a single request that does not fit even alone
        fails with the diagnosis (index in `fb` -> message) and its logits row is zeros, so
        the rest of the batch goes on. Logits are None when every request failed. Each split
        and failure is logged with the diagnosis."""
        try:
            return self.runner.forward(fb), {}
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            error = e  # leave the except block: its traceback pins the failed activations
        if fb.input_ids.device.type == "cuda":
            torch.cuda.empty_cache()
        plan = getattr(self.runner, "plan", None)
        diagnosis = (diagnose_oom(plan, batch_shape(fb), error).message() if plan is not None
                     else f"Out of memory in a forward of {fb.batch_size} requests ({error}).")
        if fb.batch_size < 2:
            self.timer.oom_failures += 1
            logger.error("%s This request fails alone; the others go on.", diagnosis)
            return None, {0: diagnosis}
        self.timer.oom_splits += 1
        logger.warning("%s Retrying the batch in two halves.", diagnosis)
        first, second = halves(fb)
        (l1, f1), (l2, f2) = self._forward(first), self._forward(second)
        failed = {**f1, **{i + first.batch_size: m for i, m in f2.items()}}
        if l1 is None and l2 is None:
            return None, failed
        ref = l1 if l1 is not None else l2
        parts = [l if l is not None else ref.new_zeros((piece.batch_size, ref.shape[1]))
                 for l, piece in ((l1, first), (l2, second))]
        return torch.cat(parts), failed


def batch_shape(fb: ForwardBatch) -> BatchShape:
    """What a forward computed, for the OOM diagnosis."""
    if fb.forward_mode.is_decode():
        return BatchShape("decode", [1] * fb.batch_size, list(fb.seq_lens_cpu))
    return BatchShape("prefill", list(fb.extend_seq_lens_cpu), list(fb.seq_lens_cpu))


def _count_penalty_tokens(reqs: list[SamplingRow], next_ids: torch.Tensor) -> None:
    """Penalty state follows the sampled tokens on the forward thread, so the next batch's
    penalties see this step's token even before the scheduler has processed it. A token
    sampled for a request that turns out to be finished is counted too; nothing reads
    that request's counts again."""
    for i, req in enumerate(reqs):
        if req.output_counts is not None:
            # A 1-element index, not next_ids[i]: a 0-dim index tensor is read on the host
            # (a device sync on CUDA); a 1-D one stays an index op on the device.
            tok = next_ids[i:i + 1]
            req.output_counts[tok] += 1
            req.seen_mask[tok] = True
