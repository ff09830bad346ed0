"""Planning the choices of one OpenAI request: prompt x n -> one generate() call each.

A list of prompts with `n` choices each gives choice index `prompt_idx * n + i`; with a
seed, choice `i` of a prompt samples with `seed + i` so the choices differ but the whole
response is reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from radixlm.messages import ReqStrOut
from radixlm.sampling_params import SamplingParams
from radixlm.server.outputs import ChoiceResult, UsageCounter
from radixlm.server.tokenizer_manager import TokenizerManager


@dataclass(slots=True)
class Choice:
    index: int
    prompt_idx: int
    input_ids: list[int]
    params: SamplingParams
    timeout: float | None = None  # the request's deadline in seconds (None: the server's)


def plan_choices(prompts: list[tuple[list[int], SamplingParams]], n: int,
                 timeout: float | None = None) -> list[Choice]:
    choices = []
    for p_idx, (ids, params) in enumerate(prompts):
        for i in range(n):
            p = params
            if params.seed is not None and i > 0:
                p = dataclasses.replace(params, seed=params.seed + i)
            choices.append(Choice(p_idx * n + i, p_idx, ids, p, timeout))
    return choices


def start_streams(tm: TokenizerManager, choices: list[Choice],
                  stream: bool) -> list[AsyncGenerator[ReqStrOut, None]]:
    """One generate() iterator per choice. Nothing is sent until they are iterated."""
    return [tm.generate(c.input_ids, c.params, stream, c.timeout) for c in choices]


def usage_of(choices: list[Choice], results: list[ChoiceResult]) -> dict[str, Any]:
    """OpenAI `usage` of a response; the prompt count is never below our own tokenization."""
    usage = UsageCounter()
    for c, r in zip(choices, results):
        usage.add(c.prompt_idx, c.index, max(len(c.input_ids), r.prompt_tokens),
                  r.cached_tokens, r.completion_tokens)
    return usage.to_dict()
