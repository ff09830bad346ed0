"""Test doubles for the HTTP process: a tiny tokenizer and a fake engine.

`FakeEngine` stands in for the scheduler + detokenizer processes: it binds the real
`scheduler_input` endpoint, answers every `TokenizedGenerateReq` with deterministic tokens
and sends `BatchStrOut`s to `api_input`, so tests exercise the real TokenizerManager and
ZMQ path without a model. Nothing here is used by the server itself.

Output rule: token `s` of a request is `gen_ids[(base + s) % len(gen_ids)]` with
`base = (seed or 0) + len(input_ids)`, so equal seeds give equal text and `seed + 1`
differs. A prompt containing `error_token_id` gets a `ReqStrOut` with `error` set; a
constrained request whose spec contains FAKE_COMPILE_ERROR fails as a grammar that does
not compile would (error_status 400). With `canned_text` set, every new request answers
that text instead, `CANNED_PIECE` characters per tick, then finishes with "stop".
A `PoolStatsReq` is answered with a fake pool of 1024 KV slots, 4 held per running request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import zmq

from radixlm.ipc import IpcEndpoints, dumps, loads, make_socket
from radixlm.messages import (AbortReq, BatchStrOut, PoolStats, PoolStatsReq, ReqStrOut,
                              TokenizedGenerateReq, TokenLogprob)

TINY_WORDS = ["hello", "world", "the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran",
              "big", "small", "red", "blue", "green", "one", "two", "three", "four", "yes",
              "no", "stop", "go", "boom", "user", "assistant", "system", "tool"]
FAKE_COMPILE_ERROR = "fake-compile-error"
CANNED_PIECE = 5
TINY_SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")


def tiny_tokenizer() -> Any:
    """A word-level `PreTrainedTokenizerFast` (specials first, then TINY_WORDS) with a
    ChatML-like template; unknown words map to <unk>. Built in memory, no downloads."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(TINY_SPECIAL + TINY_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.chat_template = TINY_CHAT_TEMPLATE
    return hf


@dataclass
class _Running:
    req: TokenizedGenerateReq
    base: int
    cached: int
    out_ids: list[int] = field(default_factory=list)
    sent_text: str = ""
    canned: str | None = None  # the whole answer, when the engine plays a canned text


class FakeEngine:
    """Scheduler + detokenizer stand-in, run in a thread. One token per request per tick."""

    def __init__(self, endpoints: IpcEndpoints, tokenizer: Any, gen_ids: list[int],
                 token_delay: float = 0.0, error_token_id: int | None = None) -> None:
        self.endpoints = endpoints
        self.tokenizer = tokenizer
        self.gen_ids = gen_ids
        self.token_delay = token_delay
        self.error_token_id = error_token_id
        self.canned_text: str | None = None
        self.received: list[TokenizedGenerateReq] = []
        self.aborted: list[str] = []
        self._prompts: list[list[int]] = []
        self._running: dict[str, _Running] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="FakeEngine", daemon=True)

    def start(self) -> "FakeEngine":
        self._thread.start()
        self._ready.wait(5)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def wait_aborted(self, n: int = 1, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.aborted) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(self.aborted) >= n

    # --- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        ctx = zmq.Context()
        pull = make_socket(ctx, zmq.PULL, self.endpoints.scheduler_input, bind=True)
        push = make_socket(ctx, zmq.PUSH, self.endpoints.api_input, bind=False)
        self._ready.set()
        try:
            while not self._stop.is_set():
                timeout_ms = 10 if not self._running else int(self.token_delay * 1000)
                while pull.poll(timeout_ms):
                    self._on_message(loads(pull.recv()), push)
                    timeout_ms = 0
                outs = [o for o in (self._step(r) for r in list(self._running.values())) if o]
                if outs:
                    push.send(dumps(BatchStrOut(outs)))
        finally:
            pull.close(0)
            push.close(0)
            ctx.term()

    def _on_message(self, msg: Any, push: zmq.Socket) -> None:
        if isinstance(msg, PoolStatsReq):  # a pool of 1024 slots, 4 per running request
            held = 4 * len(self._running)
            push.send(dumps(PoolStats(msg.rid, total_kv_slots=1024, free_kv_slots=1024 - held,
                                      held_by_requests=held, held_by_cache=0,
                                      running=len(self._running), waiting=0,
                                      free_req_rows=64 - len(self._running))))
            return
        if isinstance(msg, AbortReq):
            self.aborted.append(msg.rid)
            self._running.pop(msg.rid, None)
            return
        assert isinstance(msg, TokenizedGenerateReq), msg
        self.received.append(msg)
        c = msg.sampling_params.constraint
        if c is not None and FAKE_COMPILE_ERROR in c.spec:
            push.send(dumps(BatchStrOut([ReqStrOut(msg.rid, "", [], "abort", error=(
                "invalid regex: fake compile error"), error_status=400)])))
            return
        if self.error_token_id is not None and self.error_token_id in msg.input_ids:
            push.send(dumps(BatchStrOut([ReqStrOut(msg.rid, "", [], error="fake engine error")])))
            return
        cached = max((_common_prefix(p, msg.input_ids) for p in self._prompts), default=0)
        self._prompts.append(list(msg.input_ids))
        seed = msg.sampling_params.seed or 0
        self._running[msg.rid] = _Running(msg, seed + len(msg.input_ids),
                                          min(cached, len(msg.input_ids) - 1),
                                          canned=self.canned_text)

    def _step(self, r: _Running) -> ReqStrOut | None:
        """Generate one token of `r`; return the ReqStrOut to send now, if any."""
        if r.canned is not None:
            piece = r.canned[len(r.sent_text):len(r.sent_text) + CANNED_PIECE]
            r.sent_text += piece
            r.out_ids.append(0)
            done = len(r.sent_text) == len(r.canned)
            if done:
                self._running.pop(r.req.rid, None)
            return ReqStrOut(r.req.rid, piece, [0], "stop" if done else None, None,
                             len(r.req.input_ids), len(r.out_ids), r.cached)
        p = r.req.sampling_params
        finish: str | None = None
        matched: str | int | None = None
        new_ids: list[int] = []
        if len(r.out_ids) >= p.max_new_tokens:
            finish = "length"
        else:
            tok = self.gen_ids[(r.base + len(r.out_ids)) % len(self.gen_ids)]
            r.out_ids.append(tok)
            new_ids = [tok]
            if tok in p.stop_token_ids:
                finish, matched = "stop", tok
            elif len(r.out_ids) >= p.max_new_tokens:
                finish = "length"
        text_ids = r.out_ids[:-1] if isinstance(matched, int) else r.out_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=p.skip_special_tokens)
        for s in p.stop:
            if s in text:
                text, finish, matched = text[:text.index(s)], "stop", s
                break
        delta, r.sent_text = text[len(r.sent_text):], text
        logprobs = None
        if p.logprobs and new_ids:
            alts = [t for t in self.gen_ids if t != new_ids[0]][:p.top_logprobs]
            top = [(new_ids[0], -0.5)] + [(t, -1.5 - i) for i, t in enumerate(alts)]
            logprobs = [TokenLogprob(new_ids[0], -0.5, top[:p.top_logprobs])]
        out = ReqStrOut(r.req.rid, delta, new_ids, finish, matched, len(r.req.input_ids),
                        len(r.out_ids), r.cached, logprobs)
        # Non-streaming requests get partial outputs too: the TokenizerManager's callers
        # must aggregate either way.
        if finish is not None:
            self._running.pop(r.req.rid, None)
        return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class FakeStack:
    """Everything a test of the HTTP process needs, wired over real ZMQ endpoints."""

    tokenizer: Any
    endpoints: IpcEndpoints
    engine: FakeEngine
    tokenizer_manager: Any  # TokenizerManager
    app: Any  # FastAPI
    model_name: str


@contextmanager
def fake_stack(api_key: str | None = None, context_len: int = 256, token_delay: float = 0.0,
               model_name: str = "tiny") -> Iterator[FakeStack]:
    """A tiny tokenizer, a running FakeEngine, a TokenizerManager and the app. The app's
    lifespan (e.g. `with TestClient(app)`) starts the TokenizerManager."""
    from radixlm.config import ServerArgs
    from radixlm.server.app import create_app
    from radixlm.server.tokenizer_manager import TokenizerManager

    tok = tiny_tokenizer()
    endpoints = IpcEndpoints.create()
    gen_ids = tok.convert_tokens_to_ids(["the", "cat", "sat", "on", "mat", "and", "dog", "ran",
                                         "big", "red"])
    engine = FakeEngine(endpoints, tok, gen_ids, token_delay=token_delay,
                        error_token_id=tok.convert_tokens_to_ids("boom")).start()
    args = ServerArgs(api_key=api_key)
    tm = TokenizerManager(args, tok, endpoints, context_len=context_len, vocab_size=len(tok))
    try:
        yield FakeStack(tok, endpoints, engine, tm, create_app(tm, args, model_name), model_name)
    finally:
        engine.stop()
        endpoints.cleanup()
