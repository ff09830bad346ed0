"""Request models of the HTTP API (pydantic v2) and their translation to SamplingParams.

Models are strict (a string where a number belongs is a 400, not a silent conversion;
an int is still accepted for a float) and ignore unknown fields, as OpenAI clients send
fields we do not use. Range checks live in one place, `SamplingParams.validate`, so the
HTTP API and the offline Engine reject the same values with the same messages; the models
here only check types and the fields that SamplingParams does not have (n, logprobs).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixlm.sampling_params import SamplingParams
from radixlm.server.message_checks import check_messages
from radixlm.server.structured import CONSTRAINT_FIELD_NAMES, ConstraintFields, ToolFields

MAX_N = 128
MAX_LOGPROBS = 20
MAX_TIMEOUT_S = 7 * 24 * 3600.0


class _Strict(BaseModel):
    # NaN / Infinity are not JSON numbers; a float field refuses them.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = False
    # vLLM: usage (so far) on every chunk, not only on the last one.
    continuous_usage_stats: bool | None = False


class _SamplingFields(ConstraintFields, _Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (the structured-output
    ones come from ConstraintFields)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None  # OpenAI's default is 1.0
    top_p: float | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    user: str | None = None
    # Deadline in seconds (default --request-timeout): past it the request is aborted
    # wherever it is and answered 408 (TokenizerManager.generate).
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    # SGLang / vLLM extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    # Token id (as a JSON key) -> bias in [-100, 100], added to the logits in the sampler.
    logit_bias: dict[str, float] | None = None
    # vLLM: keep only the last N prompt tokens (-1: as many as the context allows).
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # vLLM: the prompt's and each choice's token ids in the answer.
    return_token_ids: bool | None = None
    include_stop_str_in_output: bool | None = None
    # vLLM: the logprobs of the prompt's tokens, with that many top alternatives.
    prompt_logprobs: int | None = Field(
        default=None, ge=0, le=MAX_LOGPROBS,
        description="vLLM: the logprob of every prompt token (null for the first) with this "
                    "many top alternatives, as `prompt_logprobs` on each completion choice "
                    "(on the response for chat; not with stream on chat). Such a request "
                    "does not use the prefix cache.")

    @field_validator("prompt_logprobs", mode="before")
    @classmethod
    def _whole_vocabulary(cls, v: Any) -> Any:
        if v == -1:  # vLLM: every vocabulary entry; bounded here like top_logprobs
            raise ValueError(f"prompt_logprobs=-1 (the whole vocabulary) is not supported: "
                             f"give 0 to {MAX_LOGPROBS} top alternatives per prompt token")
        return v

    @model_validator(mode="after")
    def _check_unsupported(self) -> "_SamplingFields":
        if any(not k.strip().isdigit() for k in self.logit_bias or {}):
            raise ValueError("logit_bias keys must be token ids (non-negative integers)")
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be -1 or >= 1")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be given when stream is true")
        return self

    @property
    def continuous_usage(self) -> bool:
        return bool(self.include_usage and self.stream_options
                    and self.stream_options.continuous_usage_stats)

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def _requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def to_sampling_params(self, default_max_tokens: int, *, logprobs: bool,
                           top_logprobs: int) -> SamplingParams:
        """SamplingParams for one choice; `default_max_tokens` applies when the client
        gave no limit (the room left in the context)."""
        max_tokens = self._requested_max_tokens()
        fields: dict[str, Any] = {
            "max_new_tokens": default_max_tokens if max_tokens is None else max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "logprobs": logprobs,
            "top_logprobs": top_logprobs,
            "prompt_logprobs": self.prompt_logprobs,
            "constraint": self.constraint(),
            "logit_bias": {int(k): v for k, v in self.logit_bias.items()}
            if self.logit_bias else None,
        }
        # None means "not given": keep SamplingParams' default (temperature 1.0, etc.).
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})


# --- /v1/completions ---------------------------------------------------------------------


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    # Number of top alternatives per position; 0 = only the chosen token's logprob.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "CompletionRequest":
        if self.suffix:
            raise ValueError("suffix is not supported")
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per group of `n` choices (a flat id list is one prompt)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        params = self.to_sampling_params(default_max_tokens, logprobs=self.logprobs is not None,
                                         top_logprobs=self.logprobs or 0)
        if self.echo and self.logprobs is not None:  # the prompt's logprobs come first
            params.prompt_logprobs = max(params.prompt_logprobs or 0, self.logprobs)
        return params


# --- /v1/chat/completions ----------------------------------------------------------------


class ContentPart(_Strict):
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def to_template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it: content is one string (text parts are
        joined with newlines, as vLLM's "string" content format does)."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise ValueError(f"content part type {part.type!r} is not supported "
                                     "(only 'text')")
                texts.append(part.text)
            content = "\n".join(texts)
        d: dict[str, Any] = {"role": self.role, "content": content or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        return d


class ChatCompletionRequest(ToolFields, _SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # vLLM extensions: leave the assistant turn open (default) or not; or continue the
    # last (assistant) message instead of starting a new turn.
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False

    @model_validator(mode="after")
    def _check(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using top_logprobs, logprobs must be set to true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is not available with stream on chat "
                             "completions (as in vLLM)")
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError("continue_final_message: set add_generation_prompt to false "
                                 "to continue the final message")
            if self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message: the last message must be the "
                                 "assistant's")
        check_messages(self.messages)
        return self

    def _requested_max_tokens(self) -> int | None:
        # max_completion_tokens is the newer name of max_tokens; it wins if both are given.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template_dict() for m in self.messages]

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return self.to_sampling_params(default_max_tokens, logprobs=bool(self.logprobs),
                                       top_logprobs=self.top_logprobs or 0)


# --- native /generate (SGLang-like) ------------------------------------------------------


class NativeSamplingParams(ConstraintFields, _Strict):
    """The fields of SamplingParams, under their own names, and SGLang's `regex` / `ebnf` /
    `json_schema` (any dialect of ConstraintFields is accepted)."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    skip_special_tokens: bool | None = None


class GenerateRequest(_Strict):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | None = None
    stream: bool | None = False
    return_logprob: bool | None = False
    top_logprobs_num: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # SGLang: with return_logprob, the prompt tokens from this position on are reported
    # (meta_info.input_token_logprobs); -1 (the default): only the last, with no logprob.
    logprob_start_len: int | None = None
    # SGLang: the token's text in each logprob entry, else null. SGLang's default is false;
    # radixlm always sent the text, so unset means true.
    return_text_in_logprobs: bool | None = None
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)  # as _SamplingFields

    @model_validator(mode="after")
    def _check(self) -> "GenerateRequest":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of 'text' and 'input_ids' must be given")
        if self.stream and self.is_batch:
            raise ValueError("streaming is supported for a single prompt only")
        if self.logprob_start_len is not None and self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be -1 or a non-negative integer, "
                             f"got {self.logprob_start_len}")
        prompts = self.text if self.text is not None else self.input_ids
        if isinstance(prompts, list) and len(prompts) == 0:
            raise ValueError("the prompt must not be empty")
        return self

    @property
    def is_batch(self) -> bool:
        if isinstance(self.text, list):
            return True
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)  # type: ignore[index]

    def prompts(self) -> list[str | list[int]]:
        if self.text is not None:
            return [self.text] if isinstance(self.text, str) else list(self.text)
        assert self.input_ids is not None
        if self.is_batch:
            return list(self.input_ids)  # type: ignore[arg-type]
        return [list(self.input_ids)]  # type: ignore[arg-type]

    def to_sampling_params(self, default_max_tokens: int) -> SamplingParams:
        sp = self.sampling_params or NativeSamplingParams()
        fields = {k: v for k, v in sp.model_dump(exclude=set(CONSTRAINT_FIELD_NAMES)).items()
                  if v is not None}
        fields["constraint"] = sp.constraint("sampling_params.")
        fields.setdefault("max_new_tokens", default_max_tokens)
        if self.return_logprob:
            fields["logprobs"] = True
            fields["top_logprobs"] = self.top_logprobs_num or 0
            if self.input_logprob_start() >= 0:
                fields["prompt_logprobs"] = self.top_logprobs_num or 0
                fields["logprob_start_len"] = self.input_logprob_start()
        return SamplingParams(**fields)

    def input_logprob_start(self) -> int:
        """The first prompt position whose token meta_info.input_token_logprobs reports;
        -1: only the last prompt token (SGLang's default)."""
        return -1 if self.logprob_start_len is None else self.logprob_start_len
