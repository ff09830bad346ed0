"""Scheduler: continuous batching over one ModelRunner.

One `step()` = pick the next batch (admit waiting requests as an EXTEND batch if the
PrefillAdder allows, else DECODE every running request), run it, process its results.
Requests join and leave between steps. The same `step()` drives the scheduler process
(`scheduler/process.py`) and the offline `Engine`; there is one loop, not two.

Ownership of KV slots: a request holds positions [0, kv_len) of its req_to_token row
(plus the slots of the step in flight, counted into kv_len by `commit_kv`). Finishing,
aborting or retracting a request returns all of them. `check_invariant()` verifies
free + held by requests == total.
"""

from __future__ import annotations

import logging
import random
from collections import deque

import torch

from radixlm.executor.forward_batch import ForwardMode
from radixlm.executor.model_runner import ModelRunner
from radixlm.executor.sampler import SamplingBatchInfo
from radixlm.mem import PoolInvariantError, check_pool_invariant
from radixlm.messages import AbortReq, PoolStats, ReqTokenOut, TokenizedGenerateReq
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.prefill_adder import PrefillAdder
from radixlm.scheduler.req import Req
from radixlm.scheduler.schedule_batch import OutOfKVSlots, ScheduleBatch

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, runner: ModelRunner, tokenizer, eos_token_ids: list[int],
                 max_prefill_tokens: int, random_seed: int = 0) -> None:
        self.runner = runner
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_prefill_tokens = max_prefill_tokens
        self.rng = random.Random(random_seed)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.outbox: list[ReqTokenOut] = []
        self.output_processor = OutputProcessor(tokenizer, runner.context_len, runner.vocab_size,
                                                runner.device)
        self.num_retractions = 0

    # --- limits the API process must know ---------------------------------------

    @property
    def context_len(self) -> int:
        """Longest request (prompt + output) this instance can ever hold."""
        return min(self.runner.context_len, self.runner.max_total_tokens)

    # --- input -------------------------------------------------------------------

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        p = msg.sampling_params
        req = Req(rid=msg.rid, input_ids=list(msg.input_ids), sampling_params=p, stream=msg.stream,
                  eos_token_ids=self.eos_token_ids)
        if not req.input_ids:
            req.finish("abort", error="the prompt is empty")
        elif len(req.input_ids) + p.max_new_tokens > self.context_len:
            req.finish("abort", error=(
                f"the request needs {len(req.input_ids)} prompt + {p.max_new_tokens} output "
                f"tokens but this instance holds at most {self.context_len} per request"))
        elif p.max_new_tokens == 0:
            req.finish("length")
        if req.finished:
            self.outbox.append(self.output_processor.make_output(req))
            return
        if not p.is_greedy:
            req.generator = torch.Generator(self.runner.device)
            req.generator.manual_seed(p.seed if p.seed is not None else self.rng.getrandbits(63))
        self.output_processor.init_penalty_state(req)
        self.waiting.append(req)

    def abort_request(self, msg: AbortReq) -> None:
        for req in self.waiting:
            if req.rid == msg.rid:
                self.waiting.remove(req)
                req.finish("abort")
                self.outbox.append(self.output_processor.make_output(req))
                return
        for req in self.running:
            if req.rid == msg.rid:
                # Freed by the next step's result processing, like any finished request.
                req.finish("abort")
                return

    def handle(self, msg: object) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort_request(msg)
        else:
            logger.warning("scheduler ignores unknown message %r", type(msg).__name__)

    # --- the step ------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[ReqTokenOut]:
        """Run one batch if there is one; return the outputs to send."""
        self._free_finished()
        batch = self._next_batch()
        if batch is not None:
            self._run(batch)
        if not self.has_work():
            try:
                self.check_invariant()
            except PoolInvariantError as e:  # a bug: report it, keep serving
                logger.error("pool invariant violated while idle: %s", e)
        out, self.outbox = self.outbox, []
        return out

    def _free_finished(self) -> None:
        """Free finished (or aborted) running requests and emit their last output."""
        keep = []
        for req in self.running:
            if req.finished:
                self._release(req)
                self.outbox.append(self.output_processor.make_output(req))
            else:
                keep.append(req)
        self.running = keep

    def _next_batch(self) -> ScheduleBatch | None:
        runner = self.runner
        adder = PrefillAdder(free_kv_slots=runner.allocator.available_size(),
                             free_rows=min(runner.req_to_token_pool.available_size(),
                                           runner.max_running_requests - len(self.running)),
                             max_prefill_tokens=self.max_prefill_tokens, running=self.running)
        while self.waiting and adder.try_add(self.waiting[0]):
            self.waiting.popleft()
        if adder.admitted:
            return self._batch(adder.admitted, ForwardMode.EXTEND)
        if self.running:
            return self._batch(list(self.running), ForwardMode.DECODE)
        return None

    def _batch(self, reqs: list[Req], mode: ForwardMode) -> ScheduleBatch:
        r = self.runner
        return ScheduleBatch(reqs, mode, r.req_to_token_pool, r.token_to_kv_pool, r.allocator, r.device)

    def _run(self, batch: ScheduleBatch) -> None:
        if batch.forward_mode is ForwardMode.EXTEND:
            fb = batch.prepare_for_extend()
        else:
            fb = self._prepare_decode_with_retraction(batch)
            if fb is None:
                return
        logits = self.runner.forward(fb)
        info = SamplingBatchInfo.from_reqs(batch.reqs, self.runner.vocab_size, self.runner.device)
        sampled = self.runner.sample(logits, info)
        batch.commit_kv()
        if batch.forward_mode is ForwardMode.EXTEND:
            self.running.extend(batch.reqs)
        self.outbox.extend(self.output_processor.process(batch.reqs, sampled))
        self._free_finished()

    def _prepare_decode_with_retraction(self, batch: ScheduleBatch):
        """Decode; when KV slots run out, retract requests (fewest generated tokens first)
        back to the head of the queue, freeing all their KV, until the rest fit."""
        while True:
            try:
                return batch.prepare_for_decode()
            except OutOfKVSlots:
                if len(batch.reqs) <= 1:
                    raise  # cannot happen: add_request rejects requests larger than the pool
                victim = min(batch.reqs, key=lambda r: (len(r.output_ids), -len(r.input_ids)))
                batch.reqs.remove(victim)
                self.running.remove(victim)
                self._release(victim)
                victim.retractions += 1
                self.num_retractions += 1
                self.waiting.appendleft(victim)
                logger.info("retracted %s (%d output tokens) to free KV slots", victim.rid,
                            len(victim.output_ids))

    def _release(self, req: Req) -> None:
        """Return every KV slot and the req_to_token row that `req` holds."""
        if req.req_pool_idx is None:
            return
        pool = self.runner.req_to_token_pool
        slots = pool.req_to_token[req.req_pool_idx, :req.kv_len].to(torch.int64)
        self.runner.allocator.free(slots)
        pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.kv_len = 0

    # --- invariant -------------------------------------------------------------------

    def held_by_requests(self) -> int:
        return sum(r.kv_len for r in self.running) + sum(r.kv_len for r in self.waiting)

    def check_invariant(self) -> None:
        """Raise PoolInvariantError if a KV slot or a req_to_token row leaked."""
        check_pool_invariant(self.runner.allocator, self.held_by_requests())
        rows_used = self.runner.req_to_token_pool.size - self.runner.req_to_token_pool.available_size()
        held_rows = sum(r.req_pool_idx is not None for r in [*self.running, *self.waiting])
        if rows_used != held_rows:
            raise PoolInvariantError(f"req_to_token rows leak: {rows_used} used, {held_rows} held")

    def pool_stats(self, rid: str) -> PoolStats:
        try:
            self.check_invariant()
            error = None
        except PoolInvariantError as e:
            error = str(e)
        r = self.runner
        return PoolStats(rid=rid, total_kv_slots=r.allocator.size,
                         free_kv_slots=r.allocator.available_size(),
                         held_by_requests=self.held_by_requests(), running=len(self.running),
                         waiting=len(self.waiting),
                         free_req_rows=r.req_to_token_pool.available_size(),
                         invariant_error=error)
