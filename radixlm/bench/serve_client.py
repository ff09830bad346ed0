"""One request to an OpenAI-compatible `/v1/completions`, timed chunk by chunk.

Streamed by default; a target with `stream=False` (bench serve's `--disable-stream`,
SGLang bench_serving's flag) sends unary requests, whose TTFT is their whole latency.

The clock is a parameter so that tests can drive it from a scripted fake server: the
client reads it once before sending and once per received SSE event, nothing else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from radixlm.bench.serve_metrics import RequestResult

Clock = Callable[[], float]


@dataclass(frozen=True)
class Target:
    """One server to benchmark. `backend` "radixlm" adds what only radixlm has: the cache is
    flushed before each run (`POST /flush_cache`) so warm-up and earlier runs do not
    pre-fill it, and the server's own stats (`/server_info`) are recorded."""

    name: str
    base_url: str
    backend: str = "openai"  # "openai" | "radixlm"
    model: str | None = None  # the body's "model" (None: ask /v1/models)
    api_key: str | None = None
    stream: bool = True  # False: unary requests (TTFT = E2E latency, no ITLs)
    # Merged into every request's body (`--extra-request-body`, e.g. sampling parameters).
    extra_body: dict[str, Any] | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def completion_body(model: str | None, prompt: str | list[int], output_len: int,
                    stream: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Greedy, exactly `output_len` tokens (`ignore_eos`, understood by radixlm, SGLang,
    vLLM and llama-server), streamed with a final usage chunk (or unary); `extra`'s keys
    are set last (SGLang's bench_serving `--extra-request-body`)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                            "stream": stream, "ignore_eos": True, **(extra or {})}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if model is not None:
        body["model"] = model
    return body


def _usage_into(result: RequestResult, event: dict[str, Any]) -> None:
    """Token counts from the usage chunk (OpenAI), or llama-server's `timings`."""
    usage = event.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        result.output_len = int(usage["completion_tokens"])
    if usage.get("prompt_tokens") is not None:
        result.server_prompt_tokens = int(usage["prompt_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        result.cached_tokens = int(details["cached_tokens"])
    timings = event.get("timings") or {}
    if result.cached_tokens is None and timings.get("cache_n") is not None:
        result.cached_tokens = int(timings["cache_n"])
        if result.server_prompt_tokens is None and timings.get("prompt_n") is not None:
            result.server_prompt_tokens = int(timings["prompt_n"]) + result.cached_tokens


async def send_request(client: httpx.AsyncClient, target: Target, prompt: str | list[int],
                       prompt_len: int, output_len: int, clock: Clock = time.perf_counter,
                       timeout_s: float = 3600.0) -> RequestResult:
    """Send one completion (streamed unless `target.stream` is False); never raises for a
    server-side failure (the result says `success=False` and why)."""
    if not target.stream:
        return await _send_unary(client, target, prompt, prompt_len, output_len, clock,
                                 timeout_s)
    result = RequestResult(prompt_len=prompt_len)
    chunks = 0
    text: list[str] = []
    start = clock()
    result.start_time = start
    last = start
    try:
        async with client.stream("POST", target.base_url + "/v1/completions",
                                 json=completion_body(target.model, prompt, output_len,
                                                    extra=target.extra_body),
                                 headers=target.headers(), timeout=timeout_s) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:500]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                now = clock()
                if "error" in event:
                    result.error = str(event["error"])[:500]
                    return result
                _usage_into(result, event)
                delta = "".join(c.get("text") or "" for c in event.get("choices") or [])
                if not delta:
                    continue  # role/usage-only chunks carry no output
                if chunks == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
                text.append(delta)
        result.latency = clock() - start
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if chunks == 0:
        result.error = "no output chunk received"
        return result
    if result.output_len == 0:
        result.output_len = chunks  # no usage chunk: assume one token per chunk
    result.generated_text = "".join(text)
    result.success = True
    return result


async def _send_unary(client: httpx.AsyncClient, target: Target, prompt: str | list[int],
                      prompt_len: int, output_len: int, clock: Clock,
                      timeout_s: float) -> RequestResult:
    result = RequestResult(prompt_len=prompt_len)
    start = result.start_time = clock()
    try:
        resp = await client.post(target.base_url + "/v1/completions",
                                 json=completion_body(target.model, prompt, output_len, False,
                                                    target.extra_body),
                                 headers=target.headers(), timeout=timeout_s)
        body = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = result.ttft = clock() - start
    if body is None:
        result.error = f"HTTP {resp.status_code}: {resp.text[:500]}"
        return result
    _usage_into(result, body)
    result.generated_text = "".join(c.get("text") or "" for c in body.get("choices") or [])
    if result.output_len == 0:
        result.error = "no usage.completion_tokens in the response"
        return result
    result.success = True
    return result


async def model_name(client: httpx.AsyncClient, target: Target) -> str | None:
    """The first model id of GET /v1/models (None if the server has no such route)."""
    try:
        r = await client.get(target.base_url + "/v1/models", headers=target.headers(),
                             timeout=30)
        data = r.json().get("data") or []
        return data[0]["id"] if r.status_code == 200 and data else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None
