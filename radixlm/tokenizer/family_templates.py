"""Chat templates for GGUF files that carry none (`tokenizer.chat_template` missing),
by GGUF `general.architecture`: the family's own turn format, so /v1/chat/completions
works on e.g. the Gemma 3 base GGUFs. A file's own template always wins."""

from __future__ import annotations

# Gemma 3's format (as in Google's template): a system message is folded into the first
# user turn; the assistant's role is "model"; turns end with <end_of_turn>.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '')"
    " + (message['content'] | trim) + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")

# ChatML, the Qwen families' format.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")

_BY_GGUF_ARCH = {"gemma3": GEMMA_TEMPLATE, "qwen2": CHATML_TEMPLATE, "qwen3": CHATML_TEMPLATE}


def default_chat_template(gguf_arch: str | None) -> str | None:
    return _BY_GGUF_ARCH.get(gguf_arch or "")
