"""Endpoints beyond OpenAI's that both peers' users rely on: /tokenize and /detokenize
(answers carry SGLang's and vLLM's field names at once), /version, and
GET /v1/models/{id}.

/tokenize takes a `prompt` (a string, or a list of strings: SGLang's batch) or chat
`messages` (vLLM: rendered with the chat template first); /detokenize takes `tokens`.
Bodies are parsed like the generate routes' (415 unless JSON, 400 for invalid fields).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.requests import Request
from starlette.responses import Response

import radixlm
from radixlm.server.errors import APIError, error_response, validation_message
from radixlm.server.http_util import check_json_body
from radixlm.server.openapi_responses import error_responses
from radixlm.server.protocol import ChatMessage
from radixlm.server.tokenizer_manager import TokenizerManager


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' and 'messages' must be given")
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def model_card(model_name: str, created: int, context_len: int) -> dict[str, Any]:
    return {"id": model_name, "object": "model", "created": created, "owned_by": "radixlm",
            "root": model_name, "max_model_len": context_len}


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    check_json_body(request)
    return model.model_validate_json(await request.body())


def _tokenize(tm: TokenizerManager, req: TokenizeRequest) -> dict[str, Any]:
    if req.messages is not None:
        ids = tm.apply_chat_template([m.to_template_dict() for m in req.messages],
                                     add_generation_prompt=req.add_generation_prompt is not False,
                                     continue_final_message=bool(req.continue_final_message))
        batch = [ids]
    else:
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt or [])
        special = req.add_special_tokens is not False
        batch = [list(tm.tokenizer.encode(p, add_special_tokens=special)) for p in prompts]
    single = not isinstance(req.prompt, list)
    body: dict[str, Any] = {"tokens": batch[0] if single else batch,
                            "count": len(batch[0]) if single else [len(b) for b in batch],
                            "max_model_len": tm.context_len}
    if req.return_token_strs:
        strs = [[tm.token_str(t) for t in b] for b in batch]
        body["token_strs"] = strs[0] if single else strs
    return body


def extension_routes(tm: TokenizerManager, model_name: str, created: int) -> APIRouter:
    router = APIRouter()

    async def run(request: Request, model: type[BaseModel], answer: Any) -> Response:
        try:
            return JSONResponse(answer(await _parse(request, model)))
        except ValidationError as e:
            message, param = validation_message(e)
            return error_response(400, message, param)
        except APIError as e:
            return error_response(e.status, e.message, e.param)
        except ValueError as e:
            return error_response(400, str(e))

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """Token ids of a prompt or a chat (SGLang's and vLLM's /tokenize)."""
        return await run(request, TokenizeRequest, lambda req: _tokenize(tm, req))

    @router.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        """The text of token ids: `text` (SGLang) and `prompt` (vLLM)."""
        def answer(req: DetokenizeRequest) -> dict[str, Any]:
            bad = [t for t in req.tokens if not 0 <= t < tm.vocab_size]
            if bad:
                raise APIError(400, f"tokens out of range [0, {tm.vocab_size}): {bad[:8]}",
                               "tokens")
            text = tm.tokenizer.decode(req.tokens)
            return {"text": text, "prompt": text}
        return await run(request, DetokenizeRequest, answer)

    @router.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": radixlm.__version__})

    @router.get("/v1/models/{model_id:path}", responses=error_responses(404))
    async def model(model_id: str) -> JSONResponse:
        if model_id != model_name:
            return error_response(404, f"The model '{model_id}' does not exist.", "model")
        return JSONResponse(model_card(model_name, created, tm.context_len))

    return router
