"""The OpenAI wire format: request bodies, validation messages, errors, replies and SSE chunks."""

from __future__ import annotations

import json
import re
import time
import uuid
from abc import ABC, abstractmethod
from typing import Annotated, Any, ClassVar, Final

from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# The errors are the edge's, shared with the front of ``oominfer serve``.
from oominfer.edge.errors import CLIENT_CLOSED_REQUEST as CLIENT_CLOSED_REQUEST
from oominfer.edge.errors import RETRY_AFTER_S as RETRY_AFTER_S
from oominfer.edge.errors import ApiError as ApiError
from oominfer.edge.errors import busy as busy
from oominfer.edge.errors import shutting_down as shutting_down

# Requests


def _valid_unicode(value: str) -> str:
    """Refuse text that cannot be encoded: a lone UTF-16 surrogate (``"\\ud800"`` in JSON)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"the text holds a lone surrogate (U+{ord(value[err.start]):04X} at character "
            f"{err.start}), which is not valid Unicode"
        ) from None
    return value


def _check_unicode(value: Any) -> None:
    """``_valid_unicode`` for every string (keys included) in a JSON value."""
    if isinstance(value, str):
        _valid_unicode(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key)
            _check_unicode(item)
    elif isinstance(value, list):
        for item in value:
            _check_unicode(item)


SEED_RANGE: Final = (-(2**63), 2**64 - 1)
"""What torch's generator takes."""


def _seed(value: int) -> int:
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise ValueError(f"must be from {low} to {high} (a 64-bit seed), got {value}")
    return value


def _whole_number(value: Any) -> Any:
    """``1.0`` as ``1``: OpenAI clients send integers that passed through a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
"""A string that is valid Unicode (it can be tokenized and echoed back)."""
Count = Annotated[int, BeforeValidator(_whole_number)]
"""An integer, also when sent as a float with no fraction."""

UNSUPPORTED: Final[dict[str, tuple[Any, ...]]] = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}
"""Fields this backend does not implement, and the values that ask for nothing: any other value
is refused with 400 rather than ignored."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    """``stream_options``."""

    include_usage: bool = False


class SamplingRequest(_Strict):
    """What both generation endpoints accept."""

    model: Text | None = None
    max_tokens: Count | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: Count = Field(default=1, ge=1)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: Annotated[Count, AfterValidator(_seed)] | None = None
    """Bounded by SEED_RANGE (the published schema says so: openapi.py)."""
    ignore_eos: bool = False
    """vLLM's extension: keep generating past end-of-sequence (benchmarks)."""
    user: Text | None = None
    tools: Any = Field(default=None, description="Not supported: refused unless empty.")
    tool_choice: Any = Field(default=None, description="Not supported unless none or auto.")
    functions: Any = Field(default=None, description="Not supported: refused unless empty.")
    function_call: Any = Field(default=None, description="Not supported unless none or auto.")
    response_format: Any = Field(default=None, description="Only {type: text} is supported.")
    logit_bias: Any = Field(default=None, description="Not supported: refused unless empty.")
    logprobs: Any = Field(default=None, description="Not supported: refused unless false or 0.")
    top_logprobs: Any = Field(default=None, description="Not supported: refused unless 0.")
    presence_penalty: Any = Field(default=None, description="Not supported: refused unless 0.")
    frequency_penalty: Any = Field(default=None, description="Not supported: refused unless 0.")

    @property
    def include_usage(self) -> bool:
        """A streamed reply ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> str | None:
        """The first field that asks for what this backend does not do, if any."""
        for name, neutral in UNSUPPORTED.items():
            if name in type(self).model_fields and getattr(self, name) not in neutral:
                return name
        return None


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``."""

    prompt: Text | list[int] | list[Text] | list[list[int]]
    echo: Any = Field(default=None, description="Not supported: refused unless false.")
    suffix: Any = Field(default=None, description="Not supported: refused unless empty.")
    best_of: Any = Field(default=None, description="Not supported: refused unless 1.")


class ChatMessage(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: Text
    content: Text | list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _unicode(self) -> ChatMessage:
        _check_unicode(self.content)
        _check_unicode(self.model_extra)
        return self


class ChatRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True


_UNION_TAG: Final = re.compile(r"^(str|int|float|bool|none|dict|list|tuple|[\w-]+\[.*\])$")


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The message and parameter of a 400 for a body that fails validation."""
    errors = list(exc.errors())
    if not errors:
        return "Invalid request.", None
    # a union reports each member's error: the one our own validators raised says most
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0])
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('msg', '')}.", None
    # pydantic names the member of a union that failed ("prompt.str"): not a parameter
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p))]
    param = ".".join(loc) or None
    where = f"{param}: " if param else "body: "
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"Invalid request: {where}{msg}{more}.", param


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
