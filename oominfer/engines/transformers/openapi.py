"""``/openapi.json``: the routes' request schemas, and their error answers as they are sent.

FastAPI derives the request bodies from the pydantic models in ``protocol``. What it would get
wrong is fixed here: a body that fails validation is answered 400 in OpenAI's error shape (not
FastAPI's 422), and ``/v1/*`` takes a bearer token when the server has an API key. The schema
itself is open, like ``/health``.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from oominfer.engines.transformers.protocol import SEED_RANGE

OPENAPI_PATH: Final = "/openapi.json"


class ErrorDetail(BaseModel):
    """What went wrong, and the request field it concerns."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error's body, as OpenAI's API sends it."""

    error: ErrorDetail


_MEANINGS: Final = {
    400: "Invalid request: bad JSON, a bad or unsupported field, or too long for the context.",
    401: "Missing or wrong API key.",
    404: "No such model on this server.",
    408: "The request did not arrive within --timeout-request.",
    413: "The body is larger than --max-body-size.",
    429: "Too many requests are waiting (--max-queue); retry after Retry-After seconds.",
    503: "The server is shutting down; retry on another replica.",
    507: "Out of memory: the request does not fit, even alone.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that can answer ``statuses``."""
    return {status: {"model": ErrorBody, "description": _MEANINGS[status]} for status in statuses}


def openapi_schema(app: FastAPI, *, api_key: bool) -> dict[str, Any]:
    """The app's OpenAPI document, built once."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description="OpenAI-compatible completions and chat, served with transformers.",
            routes=app.routes,
        )
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
                if api_key and path.startswith("/v1/"):
                    operation["security"] = [{"bearer": []}]
        components = schema.setdefault("components", {})
        for model in ("CompletionRequest", "ChatRequest"):
            # FastAPI's OpenAPI model keeps bounds as floats: 2**64 - 1 would read as 2**64
            seed = components["schemas"][model]["properties"]["seed"]
            seed["minimum"], seed["maximum"] = SEED_RANGE
        for unused in ("HTTPValidationError", "ValidationError"):
            components.get("schemas", {}).pop(unused, None)
        if api_key:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
    return app.openapi_schema
