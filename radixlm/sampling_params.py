"""SamplingParams: how one request samples and when it stops.

The same object is used by the offline `Engine`, the HTTP layer (after translating the
OpenAI fields) and the scheduler. `validate()` raises `ValueError` with a message fit for
a 400 response; nothing downstream re-checks user input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.constrained.constraint import Constraint


# Temperatures below this sample greedily (see SamplingParams.is_greedy).
GREEDY_TEMPERATURE = 1e-5
# logit_bias: OpenAI's value range, and at most this many biased tokens per request.
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 1024


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = no top-k cut
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    # Log-probabilities: `logprobs` asks for the chosen token's log-probability,
    # `top_logprobs` for that many alternatives per position.
    logprobs: bool = False
    top_logprobs: int = 0
    skip_special_tokens: bool = True
    # Structured output: the one validated constraint of the request (JSON schema,
    # regex, EBNF, choice, any JSON object), built by radixlm.constrained.request_mapping.
    constraint: Constraint | None = None
    # Keep a matched stop string at the end of the output text (vLLM's flag).
    include_stop_str_in_output: bool = False
    # Added to the raw logits of these token ids before sampling (OpenAI's logit_bias).
    logit_bias: dict[int, float] = field(default_factory=dict)
    # vLLM's prompt_logprobs: the logprob of every prompt token (and that many top
    # alternatives) from the prefill; None: not computed. See scheduler/prompt_logprobs.py.
    prompt_logprobs: int | None = None
    # SGLang's logprob_start_len: with prompt_logprobs, only the prompt tokens after this
    # position get a logprob (tokens start+1 ..); positions before it may come from the
    # radix cache. 0: every prompt token but the first (vLLM's and echo's shape).
    logprob_start_len: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1

    @property
    def is_greedy(self) -> bool:
        # A temperature this small is greedy in effect, and dividing the logits by it would
        # overflow float32 (1e-300 rounds to 0; softmax then yields NaN, found by the API
        # fuzzer), so it is treated as 0, as SGLang and vLLM do.
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the first invalid field."""

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        need(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 0,
             f"max_tokens must be a non-negative integer, got {self.max_new_tokens!r}")
        need(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        need(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 or >= 1, got {self.top_k}")
        need(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        need(-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        need(-2.0 <= self.presence_penalty <= 2.0,
             f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        need(0.0 < self.repetition_penalty <= 2.0,
             f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        need(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
             f"seed must be in [0, 2**63), got {self.seed}")
        need(0 <= self.top_logprobs <= 20, f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        need(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
             f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}")
        need(isinstance(self.logprob_start_len, int) and self.logprob_start_len >= 0,
             f"logprob_start_len must be >= 0, got {self.logprob_start_len!r}")
        need(all(isinstance(s, str) for s in self.stop), "stop must be a string or a list of strings")
        need(len(self.stop) <= 16, "at most 16 stop sequences are allowed")
        need(len(self.logit_bias) <= MAX_LOGIT_BIAS_TOKENS,
             f"logit_bias may bias at most {MAX_LOGIT_BIAS_TOKENS} tokens")
        need(all(-MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS for v in self.logit_bias.values()),
             f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        if vocab_size is not None:
            bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
            need(not bad, f"stop_token_ids out of range [0, {vocab_size}): {bad}")
            bad = [t for t in self.logit_bias if not 0 <= t < vocab_size]
            need(not bad, f"logit_bias token ids out of range [0, {vocab_size}): {bad[:8]}")
