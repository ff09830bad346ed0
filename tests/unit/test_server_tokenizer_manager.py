"""TokenizerManager over real ZMQ endpoints, against the FakeEngine (scheduler+detokenizer)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest

from radixlm.sampling_params import SamplingParams
from radixlm.server.errors import GenerateError
from tests.server_fakes import FakeStack, fake_stack
from radixlm.server.tokenizer_manager import TokenizerManager


@pytest.fixture
def stack() -> Iterator[FakeStack]:
    with fake_stack(context_len=64, token_delay=0.005) as s:
        yield s


def run(stack: FakeStack, body: Callable[[TokenizerManager], Awaitable[object]]) -> object:
    """Run `body(tm)` on a fresh loop with the TokenizerManager started on it."""

    async def main() -> object:
        tm = stack.tokenizer_manager
        await tm.start()
        try:
            return await asyncio.wait_for(body(tm), 10)
        finally:
            await tm.stop()

    return asyncio.run(main())


def test_generate_streams_until_finished(stack: FakeStack) -> None:
    async def body(tm: TokenizerManager) -> None:
        ids = tm.tokenize_prompt("hello world")
        outs = [o async for o in tm.generate(ids, SamplingParams(max_new_tokens=4), stream=True)]
        assert [o.finish_reason for o in outs] == [None, None, None, "length"]
        assert sum(len(o.token_ids_delta) for o in outs) == 4
        assert outs[-1].prompt_tokens == 2 and outs[-1].completion_tokens == 4
        assert "".join(o.text_delta for o in outs) == "sat on mat and"
        assert tm.num_running == 0

    run(stack, body)
    assert stack.engine.aborted == []


def test_concurrent_requests_are_routed_by_rid(stack: FakeStack) -> None:
    async def one(tm: TokenizerManager, seed: int) -> str:
        p = SamplingParams(max_new_tokens=5, seed=seed)
        return "".join([o.text_delta async for o in tm.generate([5, 6], p, stream=True)])

    async def body(tm: TokenizerManager) -> None:
        texts = await asyncio.gather(*(one(tm, s) for s in [0, 1, 0, 2]))
        assert texts[0] == texts[2] and len(set(texts)) == 3

    run(stack, body)


def test_closing_the_stream_early_aborts(stack: FakeStack) -> None:
    async def body(tm: TokenizerManager) -> None:
        gen = tm.generate([5, 6], SamplingParams(max_new_tokens=50), stream=True)
        await gen.__anext__()
        await gen.aclose()
        assert tm.num_running == 0

    run(stack, body)
    assert stack.engine.wait_aborted(1)
    assert stack.engine.aborted == [stack.engine.received[0].rid]


def test_cancelling_the_consumer_aborts(stack: FakeStack) -> None:
    async def body(tm: TokenizerManager) -> None:
        async def consume() -> None:
            async for _ in tm.generate([5, 6], SamplingParams(max_new_tokens=60), stream=True):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(stack, body)
    assert stack.engine.wait_aborted(1)


def test_engine_error_surfaces(stack: FakeStack) -> None:
    async def body(tm: TokenizerManager) -> None:
        ids = tm.tokenize_prompt("hello boom")
        with pytest.raises(GenerateError, match="fake engine error"):
            async for _ in tm.generate(ids, SamplingParams(max_new_tokens=4), stream=False):
                pass

    run(stack, body)
    assert stack.engine.aborted == []


def test_context_length_is_checked_before_sending(stack: FakeStack) -> None:
    tm = stack.tokenizer_manager
    assert tm.default_max_tokens(10) == 54
    tm.check_request([5] * 10, SamplingParams(max_new_tokens=54))
    with pytest.raises(ValueError, match=r"maximum context length is 64 tokens\. However, you "
                       r"requested 65 tokens \(10 in the messages, 55 in the completion\)"):
        tm.check_request([5] * 10, SamplingParams(max_new_tokens=55))
    with pytest.raises(ValueError, match="your request has 64 input tokens"):
        tm.check_request([5] * 64, SamplingParams(max_new_tokens=0))
    with pytest.raises(ValueError, match="empty"):
        tm.check_request([], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        tm.check_request([5], SamplingParams(max_new_tokens=1, top_p=0.0))
    with pytest.raises(ValueError, match="stop_token_ids"):
        tm.check_request([5], SamplingParams(max_new_tokens=1, stop_token_ids=[10**6]))

    async def body(tm: TokenizerManager) -> None:
        with pytest.raises(ValueError):
            async for _ in tm.generate([5] * 10, SamplingParams(max_new_tokens=60), stream=True):
                pass

    run(stack, body)
    assert stack.engine.received == []


def test_context_len_is_capped_by_the_kv_pool(stack: FakeStack) -> None:
    args = stack.tokenizer_manager.args.replace(max_total_tokens=32)
    tm = TokenizerManager(args, stack.tokenizer, stack.endpoints, 4096, len(stack.tokenizer))
    assert tm.context_len == 32


def test_tokenize_prompt_and_chat_template(stack: FakeStack) -> None:
    tm = stack.tokenizer_manager
    tok = stack.tokenizer
    assert tm.tokenize_prompt("hello world") == tok("hello world").input_ids
    assert tm.tokenize_prompt([5, 6]) == [5, 6]
    with pytest.raises(ValueError, match="out of range"):
        tm.tokenize_prompt([5, len(tok)])
    ids = tm.apply_chat_template([{"role": "user", "content": "hello"}])
    assert tok.decode(ids) == "<|im_start|> user hello <|im_end|> <|im_start|> assistant"
    no_gen = tm.apply_chat_template([{"role": "user", "content": "hello"}],
                                    add_generation_prompt=False)
    assert ids[:len(no_gen)] == no_gen and len(no_gen) < len(ids)
    assert tm.token_str(tok.convert_tokens_to_ids("cat")) == "cat"


def test_health_flag(stack: FakeStack) -> None:
    tm = stack.tokenizer_manager
    assert tm.is_healthy()
    tm.healthy = False
    assert not tm.is_healthy()
