"""Req: the scheduler's state of one request.

Lengths (all in tokens):
    fill_ids  = input_ids + output_ids   every token the request has so far
    kv_len    = how many leading fill_ids have K/V in the pool (its `prefix_len` at
                the next extend); positions [0, kv_len) of its req_to_token row are valid
    extend    = fill_ids[kv_len:]        what the next EXTEND must compute
After a decode step kv_len == len(fill_ids) - 1: the newest sampled token is the input of
the next decode and has no K/V yet.

Overlap scheduling lag: `kv_len` advances when a batch is launched (its positions are known
then), `output_ids` when its sampled tokens are processed, one step later. In between,
`pending_samples` counts the tokens sampled (or being sampled) but not yet appended, so
kv_len == len(fill_ids) + pending_samples - 1 for a running request, and the input of its
next decode is the relay entry of its row, not output_ids[-1] (see ScheduleBatch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.messages import PromptLogprobs, TokenLogprob
from radixlm.sampling_params import SamplingParams


@dataclass(slots=True)
class Req:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False
    eos_token_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    kv_len: int = 0
    finished_reason: str | None = None  # "stop" | "length" | "abort"
    matched_stop: str | int | None = None
    error: str | None = None
    # HTTP status of `error` (None: 500, an engine failure; 400 e.g. an invalid grammar,
    # 507 a lone request out of memory).
    error_status: int | None = None
    generator: torch.Generator | None = None
    # Output ids [0, sent_len) and logprobs already handed to the detokenizer.
    sent_len: int = 0
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    # Penalty state, created only when a penalty is set: counts of each output token
    # ([vocab] float32) and a mask of every token seen in prompt or output ([vocab] bool).
    output_counts: torch.Tensor | None = None
    seen_mask: torch.Tensor | None = None
    retractions: int = 0
    # Radix cache bookkeeping (used once the scheduler has a RadixCache): the tree node
    # that ends the request's cached prefix (locked while the request runs), and how many
    # leading fill_ids that prefix covers; those slots belong to the cache, not the request.
    last_node: Any = None
    cached_len: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    arrival_time: float = field(default_factory=time.monotonic)  # the dashboard's age
    # Tokens the current EXTEND computes: fill_ids[kv_len : kv_len + extend_input_len].
    # Less than extend_len while a chunked prefill is in progress.
    extend_input_len: int = 0
    # Launched batches containing this request whose results are not yet processed, and
    # how many of those sample a token for it. Its row and slots are released only when
    # `inflight` is 0: a launched forward may still read them.
    inflight: int = 0
    pending_samples: int = 0
    # First position whose K/V a failed (out of memory) forward left garbage; never cached
    # (scheduler/request_oom.py).
    kv_poisoned_from: int | None = None
    # Constrained decoding (radixlm/constrained/): the request's GrammarMatcher, attached
    # when its grammar is compiled; None for unconstrained requests.
    grammar: Any = None
    # prompt_logprobs asked: those computed so far, and whether they were sent
    # (scheduler/prompt_logprobs.py).
    prompt_logprobs: PromptLogprobs | None = None
    prompt_logprobs_sent: bool = False
    # Jump-forward (constrained/jump_forward.py): the first position whose id a jump
    # changed; while set, its K/V from there on is stale and samples are dropped.
    jump_from: int | None = None
    # Logprobs asked and a jump made: the first output index whose logprob (the model's,
    # from the logits of the extend that computes the jumped tail) has not arrived yet;
    # outputs are sent up to it only (scheduler/prompt_logprobs.py).
    logprob_gap: int | None = None

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def extend_len(self) -> int:
        return self.seq_len - self.kv_len

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def remaining_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens - len(self.output_ids)

    def finish(self, reason: str, matched: str | int | None = None, error: str | None = None,
               error_status: int | None = None) -> None:
        if self.finished_reason is None:
            self.finished_reason = reason
            self.matched_stop = matched
            self.error = error
            self.error_status = error_status

    @property
    def uses_penalties(self) -> bool:
        p = self.sampling_params
        return p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 or p.repetition_penalty != 1.0
