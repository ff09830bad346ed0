"""TokenizerManager: the API process's side of the engine.

It tokenizes prompts, validates requests against the context length, sends
`TokenizedGenerateReq` / `AbortReq` to the scheduler and routes the detokenizer's
`ReqStrOut`s back to the coroutine waiting for that rid (with --detokenizer-mode api it
detokenizes the scheduler's `BatchTokenIDOut`s itself, as they arrive).

Invariants:
- `_streams` holds one queue per request in flight, created before the request is sent
  and removed when its consumer stops (finished, failed, cancelled or abandoned), so a
  late `ReqStrOut` for a rid nobody waits on is dropped.
- A request whose consumer stops before a finished `ReqStrOut` arrived is aborted: the
  scheduler gets an `AbortReq` for it, exactly once.
- Everything runs on one asyncio loop (the one that called `start()`); sends never await,
  so they are safe inside `finally` blocks of cancelled tasks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import zmq
import zmq.asyncio

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints, dumps, loads, make_socket
from radixlm.messages import (AbortReq, BatchStrOut, BatchTokenIDOut, DashboardReq,
                              DashboardSnapshot, FlushCacheReq, FlushCacheResult, PoolStats,
                              PoolStatsReq, ReqStrOut, TokenizedGenerateReq)
from radixlm.sampling_params import SamplingParams
from radixlm.server.admission import AdmissionControl
from radixlm.server.dashboard.latency import LatencyWindow
from radixlm.server.errors import GenerateError
from radixlm.tokenizer.detokenizer import Detokenizer

logger = logging.getLogger(__name__)


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def _log_send_error(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logger.error("TokenizerManager failed to send to the scheduler: %r", fut.exception())


class TokenizerManager:
    def __init__(self, args: ServerArgs, tokenizer: Any, endpoints: IpcEndpoints,
                 context_len: int, vocab_size: int) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.endpoints = endpoints
        # A request can never hold more tokens than the KV pool has slots, so the
        # per-request limit is the smaller of the model's context and the pool.
        self.context_len = min(context_len, args.max_total_tokens or context_len)
        self.vocab_size = vocab_size
        # The launcher flips this to False when a child process dies; /health then 503s.
        self.healthy = True
        # Set by the server when it exits: long-lived streams (/dashboard/events) end.
        self.exiting = False
        # Set by the launcher from SchedulerReady: the scheduler's MemoryPlan, its
        # --max-running-requests (derived by the plan when not given) and the batch sizes
        # it captured as CUDA graphs; shown by
        # /get_server_info and /metrics.
        self.memory_plan: Any = None
        self.max_running_requests: int | None = args.max_running_requests
        self.cuda_graph_batch_sizes: list[int] | None = None
        # Also from SchedulerReady: {"requested", "resolved", "reason"} of --dtype and the
        # scheduler's compute thread count (/get_server_info).
        self.dtype: dict[str, str | None] | None = None
        self.scheduler_threads: int | None = None
        # Totals over finished requests (Prometheus counters, radixlm/server/metrics.py).
        self.requests_finished_total = 0
        # Backpressure and the drain (radixlm/server/admission.py); the launcher rebuilds
        # it with the scheduler's running limit from SchedulerReady.
        self.admission = AdmissionControl.from_limits(args.max_running_requests,
                                                      args.max_queued_requests)
        self.requests_timed_out_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # TTFT and mean ITL of recently finished streamed requests (one entry per request;
        # /dashboard).
        self.latency = LatencyWindow()
        self._streams: dict[str, asyncio.Queue[ReqStrOut]] = {}
        # Control requests waiting for their reply (PoolStats, FlushCacheResult), by rid.
        self._control_waiters: dict[str, asyncio.Future[Any]] = {}
        self._token_str_cache: dict[int, str] = {}
        # --detokenizer-mode api: the scheduler's token ids arrive here and are
        # detokenized on this loop (no detokenizer process).
        self.detokenizer = Detokenizer(tokenizer) if args.detokenizer_mode == "api" else None
        self._ctx: zmq.asyncio.Context | None = None
        self._send_sock: zmq.asyncio.Socket | None = None
        self._recv_sock: zmq.asyncio.Socket | None = None
        self._recv_task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Open the sockets and start the receive loop on the running event loop.

        Idempotent. The PULL socket binds `api_input` (the detokenizer connects to it);
        the PUSH socket connects to `scheduler_input` (the scheduler binds it).
        """
        if self._recv_task is not None:
            return
        self._ctx = zmq.asyncio.Context()
        self._send_sock = make_socket(self._ctx, zmq.PUSH, self.endpoints.scheduler_input,
                                      bind=False)
        self._recv_sock = make_socket(self._ctx, zmq.PULL, self.endpoints.api_input, bind=True)
        self._recv_task = asyncio.get_running_loop().create_task(self._recv_loop())

    async def stop(self) -> None:
        """Stop the receive loop and close the sockets. Idempotent."""
        task, self._recv_task = self._recv_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for sock in (self._send_sock, self._recv_sock):
            if sock is not None:
                sock.close(linger=0)
        self._send_sock = self._recv_sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def is_healthy(self) -> bool:
        return self.healthy and (self._recv_task is None or not self._recv_task.done())

    async def _recv_loop(self) -> None:
        assert self._recv_sock is not None
        try:
            while True:
                msg = loads(await self._recv_sock.recv())
                if isinstance(msg, BatchTokenIDOut) and self.detokenizer is not None:
                    msg = self.detokenizer.handle_batch(msg)
                outs = msg.outs if isinstance(msg, BatchStrOut) else [msg]
                for out in outs:
                    if isinstance(out, (PoolStats, FlushCacheResult, DashboardSnapshot)):
                        fut = self._control_waiters.pop(out.rid, None)
                        if fut is not None and not fut.done():
                            fut.set_result(out)
                        continue
                    if not isinstance(out, ReqStrOut):
                        logger.warning("TokenizerManager ignores unexpected %r", type(out).__name__)
                        continue
                    queue = self._streams.get(out.rid)
                    if queue is not None:  # else: the consumer left; drop it
                        queue.put_nowait(out)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("TokenizerManager receive loop died")
            self.healthy = False
            raise

    def _send(self, obj: Any) -> None:
        """Queue `obj` for the scheduler without awaiting (SNDHWM is unlimited)."""
        if self._send_sock is None:
            raise RuntimeError("TokenizerManager.start() has not been called")
        # zmq.asyncio tries a non-blocking send first; only if the pipe is full does the
        # future stay pending (then zmq completes it from the loop, nobody awaits it).
        fut = self._send_sock.send(dumps(obj))
        if fut.done():
            fut.result()  # surface a send error now
        else:  # pragma: no cover - only when the pipe is full
            fut.add_done_callback(_log_send_error)

    # --- tokenization -------------------------------------------------------------------

    def tokenize_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a completion prompt: text is encoded with the tokenizer's special
        tokens (e.g. BOS), a list of ids is checked against the vocabulary."""
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        ids = list(prompt)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:8]}")
        return ids

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True,
                            chat_template: str | None = None,
                            continue_final_message: bool = False) -> list[int]:
        """Render the chat template (the model's, or `chat_template`) to text, then encode
        it without adding special tokens (the template writes them itself).
        `continue_final_message`: the last message stays open (no end-of-turn after it)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("This model has no chat template; use /v1/completions instead.")
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=add_generation_prompt,
                tokenize=False, chat_template=chat_template,
                continue_final_message=continue_final_message)
        except Exception as e:  # jinja errors, raise_exception() in the template, ...
            raise ValueError(f"Cannot apply the chat template: {e}") from e
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def token_str(self, token_id: int) -> str:
        """The text of one token, as shown in logprobs."""
        s = self._token_str_cache.get(token_id)
        if s is None:
            s = self.tokenizer.decode([token_id])
            self._token_str_cache[token_id] = s
        return s

    # --- validation ---------------------------------------------------------------------

    def default_max_tokens(self, prompt_len: int) -> int:
        """max_new_tokens when the client gives none: the room left in the context."""
        return max(0, self.context_len - prompt_len)

    def check_request(self, input_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError (-> HTTP 400) if the request cannot be served."""
        params.validate(self.vocab_size)
        n_in = len(input_ids)
        if n_in == 0:
            raise ValueError("The prompt is empty.")
        if n_in >= self.context_len:
            raise ValueError(
                f"This model's maximum context length is {self.context_len} tokens. However, "
                f"your request has {n_in} input tokens. Please reduce the length of the input.")
        if n_in + params.max_new_tokens > self.context_len:
            raise ValueError(
                f"This model's maximum context length is {self.context_len} tokens. However, "
                f"you requested {n_in + params.max_new_tokens} tokens ({n_in} in the messages, "
                f"{params.max_new_tokens} in the completion). Please reduce the length of the "
                "messages or completion.")

    # --- generation ---------------------------------------------------------------------

    async def generate(self, input_ids: list[int], params: SamplingParams,
                       stream: bool, timeout: float | None = None) -> AsyncIterator[ReqStrOut]:
        """Send one request and yield its `ReqStrOut`s; the last has `finish_reason` set.

        Raises ValueError before sending anything if the request is invalid, and
        GenerateError if the engine reports an error for it. If the consumer stops early
        (break, aclose, cancellation), the request is aborted in the scheduler.
        `timeout` (default --request-timeout): seconds from now after which the request is
        aborted in the scheduler, wherever it is, and fails with a 408 GenerateError.
        """
        self.check_request(input_ids, params)
        params = dataclasses.replace(params)  # the scheduler side must not share our object
        rid = uuid.uuid4().hex
        queue: asyncio.Queue[ReqStrOut] = asyncio.Queue()
        self._streams[rid] = queue
        finished = False
        if timeout is None:
            timeout = self.args.request_timeout
        timer = (asyncio.get_running_loop().call_later(timeout, self._expire, rid, timeout)
                 if timeout is not None else None)
        started, first_token_at = loop_time(), None
        try:
            self._send(TokenizedGenerateReq(rid, list(input_ids), params, stream))
            while not finished:
                out = await queue.get()
                finished = out.finish_reason is not None
                if first_token_at is None and out.token_ids_delta:
                    first_token_at = loop_time()
                if finished:
                    self.requests_finished_total += 1
                    self.prompt_tokens_total += out.prompt_tokens
                    self.generation_tokens_total += out.completion_tokens
                    # Streamed requests only: a unary answer arrives in one piece.
                    if stream and first_token_at is not None and out.error is None:
                        self.latency.record(first_token_at - started, loop_time() - first_token_at,
                                            out.completion_tokens)
                if out.error is not None:
                    finished = True  # the engine dropped the request itself (or _fail did)
                    raise GenerateError(out.error, out.error_status)
                yield out
        finally:
            if timer is not None:
                timer.cancel()
            self._streams.pop(rid, None)
            if not finished and self._send_sock is not None:
                self._send(AbortReq(rid))

    def _fail(self, rid: str, message: str, status: int) -> None:
        """Abort request `rid` in the scheduler (which frees its KV wherever it is) and end
        its consumer now with an error; a late output for it is dropped."""
        queue = self._streams.pop(rid, None)
        if queue is None:
            return
        if self._send_sock is not None:
            self._send(AbortReq(rid))
        queue.put_nowait(ReqStrOut(rid, "", [], finish_reason="abort", error=message,
                                   error_status=status))

    def _expire(self, rid: str, timeout: float) -> None:
        if rid in self._streams:
            self.requests_timed_out_total += 1
            self._fail(rid, f"The request timed out after {timeout:g} s (its `timeout`, or "
                       "--request-timeout) and was aborted.", 408)

    def abort_all(self, message: str, status: int = 503) -> int:
        """Fail every request in flight (the end of a drain); returns how many."""
        rids = list(self._streams)
        for rid in rids:
            self._fail(rid, message, status)
        return len(rids)

    async def _control(self, make_req: Any, timeout: float) -> Any:
        """Send a control request built by make_req(rid) and await its reply."""
        rid = uuid.uuid4().hex
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._control_waiters[rid] = fut
        try:
            self._send(make_req(rid))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._control_waiters.pop(rid, None)

    async def pool_stats(self, timeout: float = 30.0) -> PoolStats:
        """The scheduler's KV pool state (and whether the pool invariant holds)."""
        return await self._control(PoolStatsReq, timeout)

    async def dashboard_snapshot(self, timeout: float = 5.0, **limits: int) -> DashboardSnapshot:
        """The scheduler's DashboardSnapshot (pools, radix tree, requests, recent steps)."""
        return await self._control(lambda rid: DashboardReq(rid, **limits), timeout)

    async def flush_cache(self, timeout: float = 30.0, storage: bool = False) -> FlushCacheResult:
        """Empty the radix cache (`storage`: the hicache's files too); refused (success
        False) while requests are in flight."""
        return await self._control(lambda rid: FlushCacheReq(rid, storage), timeout)

    @property
    def num_running(self) -> int:
        return len(self._streams)
