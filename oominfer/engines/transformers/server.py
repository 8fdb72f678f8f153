"""The FastAPI app: routes, error handlers, and the bridge from requests to the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from oominfer.base.version import __version__
from oominfer.edge.gate import OPENAI_ROUTES, Gate, GateState
from oominfer.edge.metrics import CONTENT_TYPE
from oominfer.engines.transformers.config import ServerConfig
from oominfer.engines.transformers.metrics import Metrics
from oominfer.engines.transformers.openapi import OPENAPI_PATH, error_responses, openapi_schema
from oominfer.engines.transformers.prompts import SeqBuilder
from oominfer.engines.transformers.protocol import (
    CHAT,
    CLIENT_CLOSED_REQUEST,
    COMPLETIONS,
    SSE_DONE,
    ApiError,
    ChatRequest,
    CompletionRequest,
    Endpoint,
    SamplingRequest,
    sse,
    usage,
    validation_message,
)
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.scheduler import Scheduler
from oominfer.engines.transformers.sequence import Event, FinishEvent, Seq, TokenEvent

log = logging.getLogger("oominfer.transformers")


class Server:
    """The FastAPI app around one engine and its scheduler."""

    def __init__(self, config: ServerConfig, engine: ModelRunner) -> None:
        """Build the app; the scheduler starts with the app's lifespan."""
        self.config = config
        self.engine = engine
        self.metrics = Metrics()
        self.gate = GateState(
            api_key=config.api_key,
            max_body_bytes=config.limits.max_body_bytes,
            metrics=self.metrics,
            routes=OPENAI_ROUTES | {OPENAPI_PATH},
        )
        config_len = getattr(engine.model.config, "max_position_embeddings", None)
        self.max_model_len: int = config.settings.max_model_len or int(config_len or 2048)
        self.scheduler = Scheduler(
            engine,
            max_num_seqs=config.max_num_seqs,
            max_queue=config.max_queue,
            metrics=self.metrics,
            max_prefill_tokens=self.max_model_len,
        )
        self.metrics.watch(self.scheduler.stats)
        self.seqs = SeqBuilder(config, engine, max_model_len=self.max_model_len)
        self.created = int(time.time())
        self.app = self._build_app()

    # generation

    def _submit(self, seq: Seq) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(queue.put_nowait, event)

        seq.emit = emit
        self.scheduler.submit(seq)

        async def events() -> AsyncIterator[Event]:
            try:
                while True:
                    event = await queue.get()
                    yield event
                    if not isinstance(event, TokenEvent):
                        return
            finally:
                if not seq.done:
                    seq.cancelled = True  # the client went away

        return events()

    async def _collect(self, seq: Seq) -> tuple[str, FinishEvent]:
        parts: list[str] = []
        async for event in self._submit(seq):
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, FinishEvent):
                return "".join(parts), event
            else:
                raise event.error
        raise ApiError(500, "The generation ended without a result.", type_="internal_error")

    def _stream(
        self, seq: Seq, endpoint: Endpoint, id_: str, *, include_usage: bool
    ) -> StreamingResponse:
        events = self._submit(seq)  # raises 429/503 before the stream starts
        name = self.config.served_model_name

        async def body() -> AsyncIterator[bytes]:
            head = {"id": id_, "object": endpoint.chunk_object, "created": int(time.time()),
                    "model": name}  # fmt: skip
            first = endpoint.first_chunk()
            if first is not None:
                yield sse({**head, "choices": [first]})
            async for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        yield sse({**head, "choices": [endpoint.chunk(event.text, None)]})
                elif isinstance(event, FinishEvent):
                    yield sse({**head, "choices": [endpoint.chunk(None, event.reason)]})
                    if include_usage:
                        yield sse({**head, "choices": [], "usage": _usage(event)})
                else:
                    yield sse(event.error.body())
            yield SSE_DONE

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def _generate(
        self,
        request: Request,
        req: SamplingRequest,
        build: Callable[[Any], Seq],
        endpoint: Endpoint,
    ) -> Response:
        """Run ``req``; answer with the whole reply, or stream it when the request asks."""

        async def answer() -> Response:
            seq = await asyncio.to_thread(build, req)  # tokenizing may take seconds
            id_ = endpoint.new_id()
            if req.stream:
                return self._stream(seq, endpoint, id_, include_usage=req.include_usage)
            text, finish = await self._collect(seq)
            name = self.config.served_model_name
            return JSONResponse(endpoint.reply(id_, name, text, finish.reason, _usage(finish)))

        # Starlette's streaming response cancels a stream whose client leaves; a whole reply
        # would generate on for nobody, holding a batch slot: watch the connection meanwhile.
        return await _unless_disconnected(request, answer())

    async def completions(self, req: CompletionRequest, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._generate(request, req, self.seqs.completion, COMPLETIONS)

    async def chat(self, req: ChatRequest, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._generate(request, req, self.seqs.chat, CHAT)

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``."""
        return {
            "object": "list",
            "data": [
                {
                    "id": self.config.served_model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "oominfer",
                    "root": self.config.model,
                    "max_model_len": self.max_model_len,
                }
            ],
        }

    # app

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self.scheduler.start()
            try:
                yield
            finally:
                self.scheduler.close()

        app = FastAPI(title="oominfer (transformers)", version=__version__, lifespan=lifespan,
                      docs_url=None, redoc_url=None, openapi_url=OPENAPI_PATH)  # fmt: skip

        @app.exception_handler(ApiError)
        async def api_error(request: Request, exc: ApiError) -> Response:
            return exc.response()

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, exc: RequestValidationError) -> Response:
            message, param = validation_message(exc)
            return ApiError(400, message, param=param, code="invalid_request").response()

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            headers = dict(exc.headers) if exc.headers else None
            return ApiError(exc.status_code, str(exc.detail), headers=headers).response()

        @app.exception_handler(Exception)
        async def unexpected(request: Request, exc: Exception) -> Response:
            log.exception("Unexpected error on %s", request.url.path)
            return ApiError(500, "Internal server error.", type_="internal_error").response()

        generation = error_responses(400, 401, 404, 408, 413, 429, 503, 507)
        app.post("/v1/completions", response_model=None, responses=generation)(self.completions)
        app.post("/v1/chat/completions", response_model=None, responses=generation)(self.chat)
        app.get("/v1/models", responses=error_responses(401, 503))(self.models)

        @app.get("/health", response_model=None)
        async def health() -> Response:
            if self.gate.draining:
                return JSONResponse({"status": "draining"}, status_code=503)
            return JSONResponse({"status": "ok"})

        @app.get("/metrics", response_model=None)
        async def metrics() -> Response:
            return Response(self.metrics.render(), media_type=CONTENT_TYPE)

        app.add_middleware(Gate, state=self.gate)
        app.openapi = lambda: openapi_schema(app, api_key=bool(self.config.api_key))  # type: ignore[method-assign]
        return app


def _usage(finish: FinishEvent) -> dict[str, int]:
    return usage(finish.prompt_tokens, finish.completion_tokens)


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """``work``'s response, or 499 after cancelling it when the client disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()  # its sequence is marked cancelled; the scheduler drops it
    return Response(status_code=CLIENT_CLOSED_REQUEST)
