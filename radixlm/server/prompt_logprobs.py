"""The prompt tokens' logprobs in the API's two shapes:

  * vLLM's `prompt_logprobs` (completions: on each choice; chat: on the response): one
    entry per prompt token, None for the first, else `{token id: {"logprob", "rank",
    "decoded_token"}}` holding the prompt token and the top-k alternatives;
  * OpenAI's legacy `echo` with `logprobs` (completions): the prompt tokens in front of
    the generated ones in `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`,
    the first token's logprob and top_logprobs null;
  * SGLang's `meta_info.input_token_logprobs` / `input_top_logprobs` (/generate): one entry
    per prompt token from `logprob_start_len` on, `[logprob, id, text or null]`, the first
    entry's logprob (and top list) null, as SGLang pads it.
The engine sends them once, complete (messages.PromptLogprobs), from the request's
logprob_start_len on (0 for the first two shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.messages import PromptLogprobs, TokenLogprob
from radixlm.server.logprobs import TokenStr, _clamp, completion_logprobs


def vllm_prompt_logprobs(pl: PromptLogprobs | None, token_str: TokenStr,
                         num_top: int) -> list[dict[str, Any] | None] | None:
    if pl is None:
        return None
    out: list[dict[str, Any] | None] = [None]
    tops = pl.top_ids or [[]] * len(pl.token_ids)
    top_vals = pl.top_values or [[]] * len(pl.token_ids)
    for tok, lp, rank, ids, vals in zip(pl.token_ids, pl.logprobs, pl.ranks, tops, top_vals):
        entry = {str(t): {"logprob": _clamp(v), "rank": r, "decoded_token": token_str(t)}
                 for r, (t, v) in enumerate(zip(ids[:num_top], vals[:num_top]), start=1)}
        entry[str(tok)] = {"logprob": _clamp(lp), "rank": rank, "decoded_token": token_str(tok)}
        out.append(entry)
    return out


def echo_logprobs(pl: PromptLogprobs | None, prompt_ids: list[int], token_str: TokenStr,
                  num_top: int) -> tuple[dict[str, Any], int]:
    """The completions `logprobs` object of the prompt's tokens, and the text offset after
    them (where the generated tokens' offsets continue)."""
    first = token_str(prompt_ids[0])
    lps = [] if pl is None else [
        TokenLogprob(t, v, list(zip(ids, vals)))
        for t, v, ids, vals in zip(pl.token_ids, pl.logprobs,
                                   pl.top_ids or [[]] * len(pl.token_ids),
                                   pl.top_values or [[]] * len(pl.token_ids))]
    body, offset = completion_logprobs(lps, token_str, num_top, len(first))
    return {"tokens": [first] + body["tokens"], "token_logprobs": [None] + body["token_logprobs"],
            "top_logprobs": [None] + body["top_logprobs"],
            "text_offset": [0] + body["text_offset"]}, offset


def join_logprobs(head: dict[str, Any], tail: dict[str, Any]) -> dict[str, Any]:
    """Two completions `logprobs` objects, one after the other."""
    return {key: head[key] + tail[key] for key in head}


def sglang_input_logprobs(pl: PromptLogprobs | None, prompt_ids: list[int], start: int,
                          text: Callable[[int], str | None], num_top: int
                          ) -> tuple[list[list[Any]], list[list[list[Any]] | None]]:
    """SGLang's `(input_token_logprobs, input_top_logprobs)` of the prompt tokens from
    position `start` on (-1: the last one only); `pl` holds tokens start+1 .. (None when
    nothing was computed, as for -1)."""
    start = len(prompt_ids) - 1 if start < 0 else start
    ids = prompt_ids[start:]
    rest = len(ids) - 1
    values: list[float | None] = [None] + [
        _clamp(v) for v in (pl.logprobs if pl is not None else [])][:rest]
    values += [None] * (len(ids) - len(values))
    tokens = [[v, t, text(t)] for v, t in zip(values, ids)]
    top_ids = (pl.top_ids if pl is not None else []) or [[]] * rest
    top_values = (pl.top_values if pl is not None else []) or [[]] * rest
    tops: list[list[list[Any]] | None] = [None] + [
        [[_clamp(v), t, text(t)] for t, v in zip(ti[:num_top], tv[:num_top])]
        for ti, tv in zip(top_ids[:rest], top_values[:rest])]
    return tokens, tops
