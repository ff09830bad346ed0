"""Small request options of /v1/completions and /v1/chat/completions that the peers'
suites (vLLM's, SGLang's) rely on, kept out of the handlers:

  * OpenAI's default `max_tokens` of 16 on /v1/completions (chat runs to the context);
  * `truncate_prompt_tokens` (vLLM): keep the last N prompt tokens (-1: what fits);
  * `return_token_ids` (vLLM): `prompt_token_ids` and `token_ids` on each choice;
  * `echo` (completions): the prompt's text in front of each choice's text.
"""

from __future__ import annotations

from typing import Any

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def completion_max_tokens(room: int) -> int:
    """max_tokens of a completion that gives none: OpenAI's 16, or less if the context is
    fuller than that."""
    return min(COMPLETION_DEFAULT_MAX_TOKENS, room)


def truncate_prompt(ids: list[int], keep: int | None, context_len: int) -> list[int]:
    """The last `keep` tokens of `ids` (`-1`: the last context_len - 1, what leaves room
    for one generated token); `None`: all of them."""
    if keep is None:
        return ids
    if keep == 0:
        raise ValueError("truncate_prompt_tokens must be -1 or >= 1")
    n = context_len - 1 if keep == -1 else keep
    return ids[-n:] if len(ids) > n else ids


def token_id_fields(enabled: bool | None, prompt_ids: list[int] | None,
                    token_ids: list[int]) -> dict[str, Any]:
    """`return_token_ids`: the fields to add to a choice (none when not asked for);
    `prompt_ids` None leaves the prompt's out (later stream chunks)."""
    if not enabled:
        return {}
    fields: dict[str, Any] = {"token_ids": list(token_ids)}
    if prompt_ids is not None:
        fields["prompt_token_ids"] = list(prompt_ids)
    return fields
