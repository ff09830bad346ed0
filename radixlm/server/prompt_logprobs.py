"""The prompt tokens' logprobs in the API's two shapes:

  * vLLM's `prompt_logprobs` (completions: on each choice; chat: on the response): one
    entry per prompt token, None for the first, else `{token id: {"logprob", "rank",
    "decoded_token"}}` holding the prompt token and the top-k alternatives;
  * OpenAI's legacy `echo` with `logprobs` (completions): the prompt tokens in front of
    the generated ones in `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`,
    the first token's logprob and top_logprobs null.
The engine sends them once, complete (messages.PromptLogprobs).
"""

from __future__ import annotations

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
