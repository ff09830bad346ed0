"""The /v1/responses request model and its translation to a chat completions request.

Invariants: every field the adapter cannot honour is a 400 naming it (built-in tools,
`reasoning`, `background`, non-text input parts), never a silent 200; the chat request
built here is validated by the same model as /v1/chat/completions, so sampling ranges,
tool plans and structured-output errors are those of the chat path.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixlm.server.errors import APIError
from radixlm.server.protocol import MAX_TIMEOUT_S, ChatCompletionRequest

Message = dict[str, Any]


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    # Refused when set (see _check_unsupported).
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    truncation: str | None = None

    @model_validator(mode="after")
    def _check_unsupported(self) -> "ResponsesRequest":
        if self.reasoning:
            raise APIError(400, "reasoning is not supported: this model has no reasoning mode.",
                           "reasoning")
        if self.background:
            raise APIError(400, "background mode is not supported.", "background")
        if self.conversation is not None:
            raise APIError(400, "conversation is not supported; use previous_response_id.",
                           "conversation")
        if self.prompt is not None:
            raise APIError(400, "prompt templates are not supported.", "prompt")
        if self.truncation not in (None, "disabled"):
            raise APIError(400, "truncation 'auto' is not supported.", "truncation")
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") != "function":
                raise APIError(400, f"tools[{i}]: tool type {tool.get('type')!r} is not "
                               "supported (only 'function').", f"tools[{i}].type")
        return self

    # --- translation --------------------------------------------------------------------

    def input_messages(self) -> list[Message]:
        """`input` as chat messages (without `instructions`)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        messages: list[Message] = []
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "message":
                messages.append({"role": item.get("role", "user"),
                                 "content": _text_of(item.get("content"), f"input[{i}]")})
            elif kind == "function_call":
                call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                        "function": {"name": item.get("name"),
                                     "arguments": item.get("arguments", "{}")}}
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant" and last.get("tool_calls") \
                        and not last.get("content"):
                    last["tool_calls"].append(call)  # parallel calls: one assistant turn
                else:
                    messages.append({"role": "assistant", "content": None,
                                     "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output")
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": output if isinstance(output, str)
                                 else _text_of(output, f"input[{i}].output")})
            else:
                raise APIError(400, f"input[{i}]: item type {kind!r} is not supported "
                               "(message, function_call, function_call_output).",
                               f"input[{i}].type")
        return messages

    def chat_request(self, history: list[Message], stream: bool) -> ChatCompletionRequest:
        """The chat completions request this response runs as: `instructions` as the
        system message, then the stored conversation (`history`), then `input`."""
        messages = list(history) + self.input_messages()
        if self.instructions:
            messages.insert(0, {"role": "system", "content": self.instructions})
        body: dict[str, Any] = {
            "messages": messages, "stream": stream, "max_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "user": self.user,
            "timeout": self.timeout, "parallel_tool_calls": self.parallel_tool_calls,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.tools:
            body["tools"] = [{"type": "function", "function": {
                k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}}
                for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(self.tool_choice)
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise APIError(400, "text.format.schema is required for json_schema.",
                               "text.format.schema")
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_,
                "strict": fmt.strict}}
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None}, strict=False)


# The chat path names the format's fields as the chat API spells them; a Responses client
# wrote them under `text.format` (longest first: one is a prefix of the other).
_CHAT_TO_RESPONSES_FIELDS = (("response_format.json_schema.schema", "text.format.schema"),
                             ("response_format", "text.format"))


def responses_field_names(text: str | None) -> str | None:
    """`text` (an error message or param from the chat path) with the chat API's field
    names for the output format replaced by the Responses API's."""
    if text is None:
        return None
    for chat, responses in _CHAT_TO_RESPONSES_FIELDS:
        text = text.replace(chat, responses)
    return text


def _text_of(content: Any, where: str) -> str:
    """The text of a message's content: a string or text parts (input_text, output_text)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of parts.",
                       f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or \
                not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}.content[{j}]: part type {kind!r} is not supported "
                           "(only text).", f"{where}.content[{j}].type")
        texts.append(part["text"])
    return "\n".join(texts)


def _chat_tool_choice(choice: str | dict[str, Any]) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, f"tool_choice {choice!r} is not supported (none, auto, required or "
                   "a function by name).", "tool_choice")
