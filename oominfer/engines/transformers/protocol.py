"""The OpenAI wire format: request bodies, validation messages, errors, replies and SSE chunks."""

from __future__ import annotations

import json
import re
import time
import uuid
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Final

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

RETRY_AFTER_S: Final = 1

# Errors


class ApiError(Exception):
    """An error answered in the OpenAI shape ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Create the error; ``status`` is the HTTP status code."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def busy(message: str, status: int = 429) -> ApiError:
    """429 (queue full) or 503 (stopping), with ``Retry-After``."""
    kind = "rate_limit_exceeded" if status == 429 else "service_unavailable"
    return ApiError(
        status,
        message,
        type_=kind,
        code=kind,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def shutting_down() -> ApiError:
    """503 for a request that arrives after SIGTERM."""
    return busy("The server is shutting down; retry on another replica.", 503)


# Requests


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    """``stream_options``."""

    include_usage: bool = False


class SamplingRequest(_Strict):
    """What both generation endpoints accept."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    ignore_eos: bool = False
    """vLLM's extension: keep generating past end-of-sequence (benchmarks)."""
    logprobs: Any = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        """A streamed reply ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False


class ChatMessage(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True


_UNION_TAG: Final = re.compile(r"^(str|int|float|bool|none|dict|list|tuple|[\w-]+\[.*\])$")


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The message and parameter of a 400 for a body that fails validation."""
    errors = list(exc.errors())
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('msg', '')}.", None
    # pydantic names the member of a union that failed ("prompt.str"): not a parameter
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p))]
    param = ".".join(loc) or None
    where = f"{param}: " if param else "body: "
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return f"Invalid request: {where}{first.get('msg', 'invalid value')}{more}.", param


# Replies


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


SSE_DONE: Final = b"data: [DONE]\n\n"


class Endpoint(ABC):
    """The reply shapes of one generation endpoint: whole, and streamed in chunks."""

    id_prefix: ClassVar[str]
    object: ClassVar[str]
    chunk_object: ClassVar[str]

    def new_id(self) -> str:
        """A fresh reply id."""
        return f"{self.id_prefix}-{uuid.uuid4().hex}"

    @abstractmethod
    def choice(self, text: str, reason: str) -> dict[str, Any]:
        """The one choice of a whole reply."""

    @abstractmethod
    def chunk(self, text: str | None, reason: str | None) -> dict[str, Any]:
        """The one choice of a streamed chunk: new text, or the finish reason."""

    def first_chunk(self) -> dict[str, Any] | None:
        """A choice streamed before any text, if the endpoint has one."""
        return None

    def reply(
        self, id_: str, model: str, text: str, reason: str, usage_: dict[str, int]
    ) -> dict[str, Any]:
        """The whole reply."""
        return {
            "id": id_,
            "object": self.object,
            "created": int(time.time()),
            "model": model,
            "choices": [self.choice(text, reason)],
            "usage": usage_,
        }


class Completions(Endpoint):
    """``/v1/completions``: choices carry ``text``."""

    id_prefix = "cmpl"
    object = "text_completion"
    chunk_object = "text_completion"

    def choice(self, text: str, reason: str) -> dict[str, Any]:
        """``{index, text, logprobs, finish_reason}``."""
        return self.chunk(text, reason)

    def chunk(self, text: str | None, reason: str | None) -> dict[str, Any]:
        """The same shape as the whole reply's choice."""
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}


class Chat(Endpoint):
    """``/v1/chat/completions``: a ``message``, or streamed ``delta``s after a role chunk."""

    id_prefix = "chatcmpl"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def choice(self, text: str, reason: str) -> dict[str, Any]:
        """``{index, message, logprobs, finish_reason}``."""
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }

    def chunk(self, text: str | None, reason: str | None) -> dict[str, Any]:
        """``{index, delta, logprobs, finish_reason}``."""
        delta = {"content": text} if text is not None else {}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

    def first_chunk(self) -> dict[str, Any] | None:
        """The assistant's role with empty content."""
        return self.chunk(None, None) | {"delta": {"role": "assistant", "content": ""}}


COMPLETIONS: Final = Completions()
CHAT: Final = Chat()
