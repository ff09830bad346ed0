"""OutputProcessor: append sampled tokens, decide who stops, build ReqTokenOut messages.

Stop rules, checked after every new token in this order:
  1. the token is in stop_token_ids                  -> "stop", matched = token id
  2. the token is an EOS id (unless ignore_eos)       -> "stop", matched = token id
  3. a stop string appears in the decoded output tail -> "stop", matched = the string
  4. max_new_tokens reached, or the context is full  -> "length"
Stop strings are searched in the text of the last few output tokens only (a window of
UTF-8 bytes of the longest stop + 4 tokens: every token decodes to at least one byte, so
a stop string completed by the newest token lies inside the window), so the check
costs O(window) per request per step, not O(output length). The detokenizer cuts the
text at the stop string; the token ids keep the token that completed it.

Streamed outputs go out at the first token, then every `stream_interval` unsent tokens
(--stream-interval); the finished request's last message carries the rest.
"""

from __future__ import annotations

import torch

from radixlm.constrained.jump_forward import JumpForward
from radixlm.constrained.scheduler_hooks import ConstrainedDecoding
from radixlm.executor.sampler import SampleOutput
from radixlm.messages import ReqTokenOut
from radixlm.scheduler.prompt_logprobs import take_prompt_logprobs
from radixlm.scheduler.req import Req


class OutputProcessor:
    def __init__(self, tokenizer, context_len: int, vocab_size: int, device: torch.device,
                 jump_forward: JumpForward | None = None, stream_interval: int = 1) -> None:
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.device = device
        self.jump_forward = jump_forward  # None: --disable-jump-forward

    def init_penalty_state(self, req: Req) -> None:
        if not req.uses_penalties:
            return
        req.output_counts = torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)
        req.seen_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        ids = torch.tensor(req.fill_ids, dtype=torch.int64, device=self.device)
        req.seen_mask[ids[ids < self.vocab_size]] = True

    def process(self, reqs: list[Req], sampled: SampleOutput) -> list[ReqTokenOut]:
        """Append one sampled token to each request; return outputs of streaming ones
        that are still running (finished requests are emitted when they are freed)."""
        outs = []
        # Host tensors (ForwardWorker.wait waited for them on CUDA): no device sync here.
        for req, tok, lp in zip(reqs, sampled.next_token_ids.tolist(), sampled.token_logprobs()):
            if req.finished or req.jump_from is not None:  # aborted while its step ran,
                # or (overlap) finished or jumped forward after the previous step's token:
                # this one is discarded and never reaches a client
                continue
            if req.sampling_params.max_new_tokens == 0:  # ran only for its prompt_logprobs
                req.finish("length")
                continue
            req.output_ids.append(tok)
            if lp is not None:
                req.pending_logprobs.append(lp)
            if req.grammar is not None:  # constrained: the matcher advances (may finish it)
                ConstrainedDecoding.accept(req, tok)
            # (Penalty counts were updated on the forward worker when the token was sampled.)
            self.check_finished(req, tok)
            if req.grammar is not None and not req.finished and self.jump_forward is not None:
                self.jump_forward.try_jump(req)  # before streaming: deltas are canonical
            if req.stream and not req.finished and self.stream_due(req):
                outs.append(self.make_output(req))
        return outs

    def stream_due(self, req: Req) -> bool:
        """A running streamed request's output is due: its first token, then every
        `stream_interval` unsent tokens."""
        return req.sent_len == 0 or len(req.output_ids) - req.sent_len >= self.stream_interval

    def check_finished(self, req: Req, tok: int) -> None:
        p = req.sampling_params
        if tok in p.stop_token_ids:
            req.finish("stop", matched=tok)
        elif not p.ignore_eos and tok in req.eos_token_ids:
            req.finish("stop", matched=tok)
        elif p.stop and (hit := self._find_stop_string(req)) is not None:
            req.finish("stop", matched=hit)
        elif len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_len:
            req.finish("length")

    def _find_stop_string(self, req: Req) -> str | None:
        stops = req.sampling_params.stop
        window = max(len(s.encode()) for s in stops) + 4
        tail = self.tokenizer.decode(req.output_ids[-window:],
                                     skip_special_tokens=req.sampling_params.skip_special_tokens)
        # The earliest-ending stop string wins when several complete in the same token.
        hits = [(tail.find(s) + len(s), s) for s in stops if s in tail]
        return min(hits)[1] if hits else None

    @staticmethod
    def make_output(req: Req) -> ReqTokenOut:
        """Everything not yet sent for `req`; advances its sent offsets."""
        p = req.sampling_params
        # Jumped tokens wait for their logprobs (constrained/jump_forward.py).
        end = len(req.output_ids) if req.logprob_gap is None else req.logprob_gap
        new_ids = req.output_ids[req.sent_len:end]
        req.sent_len = end
        logprobs = req.pending_logprobs if p.logprobs else None
        req.pending_logprobs = []
        return ReqTokenOut(
            rid=req.rid,
            new_token_ids=new_ids,
            finish_reason=req.finished_reason,
            matched_stop=req.matched_stop,
            prompt_tokens=len(req.input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            logprobs=logprobs,
            prompt_logprobs=take_prompt_logprobs(req),
            skip_special_tokens=p.skip_special_tokens,
            include_stop_str=p.include_stop_str_in_output,
            stop_hold_chars=max((len(s) for s in p.stop), default=1) - 1,
            error=req.error,
            error_status=req.error_status,
        )
