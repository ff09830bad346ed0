"""Log-probabilities in the two OpenAI response formats.

- completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`
  where `top_logprobs[i]` holds the top-k alternatives plus the chosen token.
- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{token, logprob, bytes}]}]}`

Token strings come from `token_str(id)` (the tokenizer's decode of that one id).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from radixlm.messages import TokenLogprob

TokenStr = Callable[[int], str]

# JSON has no -inf; vLLM clamps the same way.
_MIN_LOGPROB = -9999.0


def _clamp(lp: float) -> float:
    return _MIN_LOGPROB if math.isnan(lp) or lp < _MIN_LOGPROB else float(lp)


def completion_logprobs(lps: Sequence[TokenLogprob], token_str: TokenStr, num_top: int,
                        text_offset: int = 0) -> tuple[dict[str, Any], int]:
    """The completions `logprobs` object for `lps`, and the text offset after them.

    `text_offset` is where the first token starts in the completion text (streaming
    chunks continue the previous chunk's offset)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    offsets: list[int] = []
    for lp in lps:
        tok = token_str(lp.token_id)
        tokens.append(tok)
        token_logprobs.append(_clamp(lp.logprob))
        top = {token_str(t): _clamp(v) for t, v in lp.top[:num_top]}
        top.setdefault(tok, _clamp(lp.logprob))
        top_logprobs.append(top)
        offsets.append(text_offset)
        text_offset += len(tok)
    body = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}
    return body, text_offset


def _chat_entry(token_id: int, logprob: float, token_str: TokenStr) -> dict[str, Any]:
    tok = token_str(token_id)
    return {"token": tok, "logprob": _clamp(logprob), "bytes": list(tok.encode("utf-8"))}


def chat_logprobs(lps: Sequence[TokenLogprob], token_str: TokenStr, num_top: int) -> dict[str, Any]:
    content = []
    for lp in lps:
        entry = _chat_entry(lp.token_id, lp.logprob, token_str)
        entry["top_logprobs"] = [_chat_entry(t, v, token_str) for t, v in lp.top[:num_top]]
        content.append(entry)
    return {"content": content}
