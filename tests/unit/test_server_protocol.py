"""The OpenAI request models: types, defaults, and translation to SamplingParams."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from radixlm.server.errors import validation_message
from radixlm.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest


def test_completion_defaults_follow_openai() -> None:
    req = CompletionRequest.model_validate_json(
        '{"model": "m", "prompt": "hi", "response_format": {"type": "text"}, "logit_bias": {}}')
    p = req.sampling_params(default_max_tokens=77)
    assert p.temperature == 1.0 and p.top_p == 1.0 and p.max_new_tokens == 77
    assert not p.logprobs and req.num_choices == 1 and not req.include_usage


def test_completion_fields_map_to_sampling_params() -> None:
    req = CompletionRequest.model_validate({
        "prompt": "hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "stop": "x", "seed": 3,
        "frequency_penalty": 0.1, "presence_penalty": 0.2, "top_k": 4, "min_p": 0.1,
        "repetition_penalty": 1.1, "ignore_eos": True, "stop_token_ids": [2],
        "skip_special_tokens": False, "logprobs": 3, "unknown_field": {"ignored": True}})
    p = req.sampling_params(default_max_tokens=100)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (5, 0.0, 0.5, 4, 0.1)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.1, 0.2, 1.1)
    assert p.stop == ["x"] and p.stop_token_ids == [2] and p.ignore_eos and p.seed == 3
    assert not p.skip_special_tokens and p.logprobs and p.top_logprobs == 3


@pytest.mark.parametrize("prompt,expected", [
    ("hi", ["hi"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1], [2, 3]], [[1], [2, 3]]),
])
def test_completion_prompt_forms(prompt: object, expected: list[object]) -> None:
    assert CompletionRequest.model_validate({"prompt": prompt}).prompts() == expected


@pytest.mark.parametrize("body", [
    '{"prompt": 5}',
    '{"prompt": [true]}',
    '{"prompt": []}',
    '{"prompt": "a", "max_tokens": "5"}',
    '{"prompt": "a", "max_tokens": 5.5}',
    '{"prompt": "a", "temperature": "hot"}',
    '{"prompt": "a", "n": 0}',
    '{"prompt": "a", "logprobs": 21}',
    '{"prompt": "a", "prompt_logprobs": 21}',
    '{"prompt": "a", "stream_options": {"include_usage": true}}',
    '{"prompt": "a", "truncate_prompt_tokens": 0}',
    '{"prompt": "a", "stream": "yes"}',
    '{"prompt": "a", "logit_bias": {"five": 1.0}}',
    '{"prompt": "a", "logit_bias": {"5": "x"}}',
    '{"max_tokens": 3}',
    '{bad json',
    '',
])
def test_completion_rejects(body: str) -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate_json(body)
    message, _ = validation_message(info.value)
    assert message


def test_chat_max_completion_tokens_wins_and_parts_join() -> None:
    req = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]}],
        "max_tokens": 3, "max_completion_tokens": 9, "logprobs": True, "top_logprobs": 2})
    p = req.sampling_params(default_max_tokens=100)
    assert p.max_new_tokens == 9 and p.logprobs and p.top_logprobs == 2
    assert req.template_messages() == [{"role": "user", "content": "a\nb"}]


def test_chat_rejects_images_and_bad_roles() -> None:
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    with pytest.raises(ValueError, match="not supported"):
        req.template_messages()
    for body in ['{"messages": []}', '{"messages": [{"role": "robot", "content": "x"}]}',
                 '{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}',
                 '{"messages": "hi"}']:
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate_json(body)


def test_validation_message_names_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate_json('{"prompt": "a", "max_tokens": "5"}')
    message, param = validation_message(info.value)
    assert param == "max_tokens" and "max_tokens" in message


def test_native_generate_request() -> None:
    req = GenerateRequest.model_validate({"text": "hi", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "stop": "x"}})
    p = req.to_sampling_params(default_max_tokens=128)
    assert (p.max_new_tokens, p.temperature, p.stop) == (4, 0.0, ["x"])
    assert not req.is_batch and req.prompts() == ["hi"]
    batch = GenerateRequest.model_validate({"input_ids": [[1, 2], [3]]})
    assert batch.is_batch and batch.prompts() == [[1, 2], [3]]
    assert batch.to_sampling_params(default_max_tokens=128).max_new_tokens == 128
    for bad in [{}, {"text": "a", "input_ids": [1]}, {"text": ["a", "b"], "stream": True}]:
        with pytest.raises(ValidationError):
            GenerateRequest.model_validate(bad)
