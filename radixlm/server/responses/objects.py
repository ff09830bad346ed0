"""Building Responses API objects (the `response` body, its output items, usage) from
chat completions results.

Invariants: output items come in the order the model produced them (the assistant text,
then its function calls); `status` is "incomplete" with reason max_output_tokens when the
chat choice stopped at its length limit; ids are `resp_`, `msg_` and `fc_` + hex.
"""

from __future__ import annotations

import uuid
from typing import Any

from radixlm.server.responses.request import Message, ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def response_body(rid: str, created: int, model: str, req: ResponsesRequest,
                  output: list[dict[str, Any]], status: str,
                  usage: dict[str, Any] | None) -> dict[str, Any]:
    fmt = req.text.format if req.text and req.text.format else None
    text_format = {"type": "text"} if fmt is None else \
        fmt.model_dump(by_alias=True, exclude_none=True)
    tool_choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
    return {
        "id": rid, "object": "response", "created_at": created, "model": model,
        "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {}, "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "reasoning": None,
        "store": req.store is not False, "temperature": req.temperature,
        "text": {"format": text_format}, "tool_choice": tool_choice,
        "tools": req.tools or [], "top_p": req.top_p, "truncation": "disabled",
        "background": False, "user": req.user, "usage": usage,
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def output_of_chat_message(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items of a non-streamed chat answer."""
    items = []
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        items.append(call_item(new_id("fc"), call["id"], fn["name"], fn["arguments"]))
    return items


def conversation_after(messages: list[Message], output: list[dict[str, Any]]) -> list[Message]:
    """`messages` followed by the assistant turn that `output` is (for a follow-up)."""
    text = "".join(p["text"] for item in output if item["type"] == "message"
                   for p in item["content"])
    calls = [{"id": i["call_id"], "type": "function",
              "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in output if i["type"] == "function_call"]
    turn: Message = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = calls
    elif not text:
        turn["content"] = ""
    return [*messages, turn]
