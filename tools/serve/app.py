"""The HTTP face of the server: starlette routes in OpenAI's shapes.

``/v1/completions`` and ``/v1/chat/completions`` (server-sent events when ``stream``),
``/v1/models``, ``/health`` and ``/stats``. A handler reads and checks the request and
tokenizes it (no MLX here: the scheduler thread owns it), hands a Job to the scheduler,
and relays the job's events; a client that goes away cancels its job at once. Every
refusal is an OpenAI error body: 400 bad input, 404 unknown model or route, 413 body too
large, 429 queue full and 503 shutting down (both with ``Retry-After``).
"""

import asyncio
import json
import logging
import time
from dataclasses import fields

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlxgraph.generation.options import OptionError, SamplingOptions
from mlxgraph.tools.serve.job import Job
from mlxgraph.tools.serve.openai_requests import (
    RequestError,
    parse_chat,
    parse_completion,
)
from mlxgraph.tools.serve.openai_responses import ResponseBuilder
from mlxgraph.tools.serve.request_json import parse_json
from mlxgraph.tools.serve.request_tokens import RequestTokens

MAX_BODY_BYTES = 8 << 20
RETRY_AFTER_SECONDS = 1
log = logging.getLogger("mlxgraph.serve")


def error_response(e: RequestError) -> JSONResponse:
    """The OpenAI error document of ``e`` with its status (and Retry-After on 429/503)."""
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if e.status in (429, 503) else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def read_body(request) -> bytes:
    """The request body, at most MAX_BODY_BYTES. Raises RequestError (413)."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        raise RequestError(f"the request body is over {MAX_BODY_BYTES} bytes", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(f"the request body is over {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


class Handlers:
    """The routes, over one scheduler.

    Args:
        scheduler: the started Scheduler; model_id: the name /v1/models lists.
    """

    def __init__(self, scheduler, model_id: str, tokenize_timeout: float = 5.0):
        self.scheduler, self.info, self.model_id = scheduler, scheduler.info, model_id
        self.max_tokens = scheduler.options.max_tokens
        self.created = int(time.time())
        self.tokens = RequestTokens(scheduler.info, tokenize_timeout)

    async def health(self, request):
        return JSONResponse({"status": "ok"})

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": self.created,
             "owned_by": "mlxgraph"}]})

    async def stats(self, request):
        return JSONResponse(self.scheduler.stats())

    async def completions(self, request):
        return await self._serve(request, "completion")

    async def chat(self, request):
        return await self._serve(request, "chat")

    def _job(self, req, ids) -> Job:
        if req.model is not None and req.model != self.model_id:
            raise RequestError(f"model {req.model!r} does not exist here; this server runs "
                               f"{self.model_id!r}", "model", status=404,
                               code="model_not_found")
        if req.max_tokens is not None and req.max_tokens > self.max_tokens:
            raise RequestError(f"'max_tokens' {req.max_tokens} is over this server's limit "
                               f"of {self.max_tokens}", "max_tokens")
        bad = [t for t in req.logit_bias if t >= self.info.vocab_size]
        if bad:
            raise RequestError(f"'logit_bias': token id {bad[0]} is outside the vocabulary "
                               f"[0, {self.info.vocab_size})", "logit_bias")
        try:  # the request's fields are checked already; this is the library's own check
            sampling = SamplingOptions(**{f.name: getattr(req, f.name)
                                          for f in fields(SamplingOptions)})
        except OptionError as e:
            raise RequestError(str(e), e.option) from None
        # --chat-template's turn end (a built-in's) ends a chat answer as the model's EOS would
        template = getattr(self.info.tokenizer, "template", None)
        stop = (*req.stop, *template.stops) if template and req.kind == "chat" else req.stop
        return Job(ids, req.max_tokens or self.max_tokens, sampling, stop,
                   () if req.ignore_eos else self.info.stop_ids, req.logprobs)

    async def _serve(self, request, kind):
        try:
            doc = parse_json(await read_body(request))
            parse = parse_completion if kind == "completion" else parse_chat
            req = parse(doc, self.scheduler.options.sampling)
            job = self._job(req, await self.tokens.ids(req))
        except RequestError as e:
            return error_response(e)
        except ClientDisconnect:
            log.info("a client went away before its request was read")
            return Response(status_code=499)  # nobody reads this
        queue, loop = asyncio.Queue(), asyncio.get_running_loop()
        job.post = lambda event: _post(loop, queue, event)
        try:
            self.scheduler.submit(job)
        except RequestError as e:
            return error_response(e)
        builder = ResponseBuilder(kind, self.model_id, self._token_text)
        first = await self._next(request, job, queue)
        if first is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        if first[0] == "error":
            return error_response(RequestError(first[2], status=first[1], kind="server_error"))
        if req.stream:
            return StreamingResponse(self._events(job, queue, builder, req, first),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._whole(request, job, queue, builder, first)

    async def _next(self, request, job, queue):
        """The job's next event, or None (the job cancelled) when the client goes first."""
        if not queue.empty():
            return queue.get_nowait()
        getter = asyncio.ensure_future(queue.get())
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if getter.done():
            return getter.result()
        getter.cancel()
        self.scheduler.cancel(job)
        log.info("request %d: the client went away; cancelled", job.number)
        return None

    async def _whole(self, request, job, queue, builder, event):
        pieces, entries = [], []
        while event[0] == "token":
            pieces.append(event[1])
            if event[2] is not None:
                entries.append((event[2], event[1], event[3]))
            event = await self._next(request, job, queue)
            if event is None:
                return Response(status_code=499)
        if event[0] == "error":
            return error_response(RequestError(event[2], status=event[1], kind="server_error"))
        logprobs = entries if job.logprobs is not None else ()
        return JSONResponse(builder.whole("".join(pieces), event[1], event[2], logprobs))

    async def _events(self, job, queue, builder, req, event):
        done = False
        try:
            if req.kind == "chat":
                yield _sse(builder.chunk("", first=True))
            while True:
                if event[0] == "token":
                    # A token that leaves a character incomplete sends nothing (no empty
                    # delta), unless the client asked for its log-probability.
                    lp = [(event[2], event[1], event[3])] if event[3] is not None else ()
                    if event[1] or lp:
                        yield _sse(builder.chunk(event[1], lp))
                elif event[0] == "done":
                    done = True
                    yield _sse(builder.chunk("", finish_reason=event[1]))
                    if req.include_usage:
                        yield _sse(builder.usage_chunk(event[2]))
                    yield "data: [DONE]\n\n"
                    return
                else:
                    done = True
                    yield _sse(RequestError(event[2], status=event[1], kind="server_error").body())
                    yield "data: [DONE]\n\n"
                    return
                event = await queue.get()
        finally:
            if not done:  # the client went away (or the server is stopping): free the session
                self.scheduler.cancel(job)
                log.info("request %d: the stream was closed before its end; cancelled",
                         job.number)

    def _token_text(self, token: int) -> str:
        tok = self.info.tokenizer
        return tok.decode([token]) if tok is not None else str(token)


def _post(loop, queue, event) -> None:
    try:
        loop.call_soon_threadsafe(queue.put_nowait, event)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


async def _disconnected(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(doc) -> str:
    return f"data: {json.dumps(doc)}\n\n"


async def _server_error(request, exc):
    """Whatever a handler did not expect: a JSON 500, never starlette's plain text."""
    log.error("%s %s failed: %s: %s", request.method, request.url.path,
              type(exc).__name__, exc, exc_info=exc)
    return JSONResponse({"error": {"message": f"internal error: {type(exc).__name__}",
                                   "type": "server_error", "param": None, "code": None}},
                        status_code=500)


async def _http_error(request, exc):
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse({"error": {"message": f"{request.method} {request.url.path}: "
                                   f"{exc.detail}", "type": kind, "param": None,
                                   "code": None}}, status_code=exc.status_code)


def build_app(scheduler, model_id: str, lifespan=None, tokenize_timeout: float = 5.0):
    """The starlette application over a started scheduler (its Handlers: ``app.state``)."""
    h = Handlers(scheduler, model_id, tokenize_timeout)
    routes = [
        Route("/health", h.health, methods=["GET"]),
        Route("/v1/models", h.models, methods=["GET"]),
        Route("/stats", h.stats, methods=["GET"]),
        Route("/v1/completions", h.completions, methods=["POST"]),
        Route("/v1/chat/completions", h.chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        HTTPException: _http_error, Exception: _server_error})
    app.state.handlers = h
    return app


__all__ = ["build_app", "error_response", "read_body"]
