"""The HTTP face of the server: starlette routes in OpenAI's shapes.

``/v1/completions`` and ``/v1/chat/completions`` (server-sent events when ``stream``),
``/v1/models``, ``/health`` and ``/stats``. A handler reads and checks the request and
tokenizes it (no MLX here: the scheduler thread owns it), hands a Job to the scheduler,
and relays the job's events; a client that goes away cancels its job at once. Every
refusal is an OpenAI error body: 400 bad input, 404 unknown model or route, 413 body too
large, 429 queue full and 503 shutting down (both with ``Retry-After``).
"""

import asyncio
import logging
import time
from dataclasses import fields, replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlxgraph.generation.options import OptionError, SamplingOptions
from mlxgraph.tools.serve.endpoints import Endpoints
from mlxgraph.tools.serve.job import Job
from mlxgraph.tools.serve.metrics import Metrics
from mlxgraph.tools.serve.openai_requests import RequestError, parse_chat, parse_completion
from mlxgraph.tools.serve.openai_responses import ResponseBuilder
from mlxgraph.tools.serve.relay import GONE, Relay, error_doc, error_response
from mlxgraph.tools.serve.request_grammar import Grammars
from mlxgraph.tools.serve.request_json import parse_json
from mlxgraph.tools.serve.request_tokens import RequestTokens
from mlxgraph.tools.serve.response_models import ModelCard, ModelList
from mlxgraph.tools.serve.tool_calls import grammar as tool_grammar
from mlxgraph.tools.serve.tool_calls import style_of

MAX_BODY_BYTES = 8 << 20
log = logging.getLogger("mlxgraph.serve")


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
        self.grammars = Grammars(scheduler.info, self.tokens)
        # the tool-call syntax the model was taught, by its chat template
        self.tool_style = style_of(getattr(scheduler.info.tokenizer, "chat_template", None))

    async def health(self, request):
        return JSONResponse({"status": "ok"})

    def model_card(self) -> ModelCard:
        """The served model as /v1/models lists it."""
        return ModelCard(id=self.model_id, created=self.created, owned_by="mlxgraph")

    def check_model(self, model) -> None:
        """Raises RequestError (404, model_not_found) unless ``model`` is None or ours."""
        if model is not None and model != self.model_id:
            raise RequestError(f"model {model!r} does not exist here; this server runs "
                               f"{self.model_id!r}", "model", status=404,
                               code="model_not_found")

    async def body(self, request) -> bytes:
        """The request's body (RequestError 413 past MAX_BODY_BYTES)."""
        return await read_body(request)

    async def models(self, request):
        return JSONResponse(ModelList(data=[self.model_card()]).dump())

    async def stats(self, request):
        return JSONResponse(self.scheduler.stats())

    async def completions(self, request):
        return await self._serve(request, "completion")

    async def chat(self, request):
        return await self._serve(request, "chat")

    def _check(self, req, prompts) -> None:
        """What the request asks of this server: its model, its limits, its vocabulary."""
        self.check_model(req.model)
        if req.max_tokens is not None and req.max_tokens > self.max_tokens:
            raise RequestError(f"'max_tokens' {req.max_tokens} is over this server's limit "
                               f"of {self.max_tokens}", "max_tokens")
        slots = self.scheduler.options.max_sessions
        if req.n * len(prompts) > slots:
            raise RequestError(f"{req.n * len(prompts)} choices ('n' times the prompts) are "
                               f"more than this server generates at once ({slots})",
                               "n" if req.n > 1 else "prompt")
        bad = [t for t in req.logit_bias if t >= self.info.vocab_size]
        if bad:
            raise RequestError(f"'logit_bias': token id {bad[0]} is outside the vocabulary "
                               f"[0, {self.info.vocab_size})", "logit_bias")

    def _jobs(self, req, prompts, constraints) -> list:
        """The request's jobs: ``n`` choices of each prompt, choice j of a prompt a fork of
        its first (the prompt prefilled once) sampling with ``seed + j``."""
        try:  # the request's fields are checked already; this is the library's own check
            sampling = SamplingOptions(**{f.name: getattr(req, f.name)
                                          for f in fields(SamplingOptions)})
        except OptionError as e:
            raise RequestError(str(e), e.option) from None
        # --chat-template's turn end (a built-in's) ends a chat answer as the model's EOS would
        template = getattr(self.info.tokenizer, "template", None)
        stop = (*req.stop, *template.stops) if template and req.kind == "chat" else req.stop
        jobs, constraints = [], iter(constraints)
        for ids in prompts:
            leader = None
            for j in range(req.n):
                seed = None if sampling.seed is None else (sampling.seed + j) % 2**63
                job = Job(ids, req.max_tokens or self.max_tokens, replace(sampling, seed=seed),
                          stop, () if req.ignore_eos else self.info.stop_ids, req.logprobs,
                          leader=leader, constraint=next(constraints))
                leader = leader or job
                jobs.append(job)
        return jobs

    async def _prefixes(self, req, prompts) -> list:
        """Each choice's text before its tokens: the prompt's when ``echo``, else '' (token
        ids decoded on the tokenizing threads, as the prompts were encoded)."""
        if not req.echo:
            return [""] * (req.n * len(prompts))
        tok = self.info.tokenizer
        if tok is None and any(isinstance(p, list) for p in req.prompts):
            raise RequestError("'echo' of token ids needs a tokenizer; this model has none",
                               "echo")
        texts = []
        for p, ids in zip(req.prompts, prompts):
            texts.append(p if isinstance(p, str) else await self.tokens.decode(ids, "echo"))
        return [t for t in texts for _ in range(req.n)]

    async def _serve(self, request, kind):
        try:
            doc = parse_json(await read_body(request))
            parse = parse_completion if kind == "completion" else parse_chat
            req = parse(doc, self.scheduler.options.sampling)
            prompts = await self.tokens.ids(req)
            self._check(req, prompts)
            if req.tool_choice not in ("none", "auto"):  # a call is forced: constrained
                req.constraint = tool_grammar(req.tools, req.tool_choice, self.tool_style)
            constraints = await self.grammars.constraints(req, req.n * len(prompts))
            prefixes = await self._prefixes(req, prompts)
            jobs = self._jobs(req, prompts, constraints)
        except RequestError as e:
            return error_response(e)
        except ClientDisconnect:
            log.info("a client went away before its request was read")
            return Response(status_code=GONE)
        queue, loop = asyncio.Queue(), asyncio.get_running_loop()
        for k, job in enumerate(jobs):
            job.post = lambda event, k=k: _post(loop, queue, (k, event))
        try:
            self.scheduler.submit(jobs)
        except RequestError as e:
            return error_response(e)
        builder = ResponseBuilder(kind, self.model_id, self._token_text)
        tools = None if req.tool_choice == "none" else (
            {t["function"]["name"] for t in req.tools}, self.tool_style)
        relay = Relay(self.scheduler, request, jobs, queue, builder, req, prefixes, tools)
        first = await relay.next()
        if first is None:
            return Response(status_code=GONE)
        if first[1][0] == "error":
            relay.cancel()
            return error_response(RequestError(first[1][2], status=first[1][1],
                                               kind="server_error"))
        if req.stream:
            return StreamingResponse(relay.events(first), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await relay.whole(first)

    def _token_text(self, token: int) -> str:
        tok = self.info.tokenizer
        return tok.decode([token]) if tok is not None else str(token)


def _post(loop, queue, event) -> None:
    try:
        loop.call_soon_threadsafe(queue.put_nowait, event)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


async def _server_error(request, exc):
    """Whatever a handler did not expect: a JSON 500, never starlette's plain text."""
    log.error("%s %s failed: %s: %s", request.method, request.url.path,
              type(exc).__name__, exc, exc_info=exc)
    error = RequestError(f"internal error: {type(exc).__name__}", status=500,
                         kind="server_error")
    return JSONResponse(error_doc(error), status_code=500)


async def _http_error(request, exc):
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    error = RequestError(f"{request.method} {request.url.path}: {exc.detail}", kind=kind)
    return JSONResponse(error_doc(error), status_code=exc.status_code)


def build_app(scheduler, model_id: str, lifespan=None, tokenize_timeout: float = 5.0):
    """The starlette application over a started scheduler (its Handlers: ``app.state``)."""
    h = Handlers(scheduler, model_id, tokenize_timeout)
    metrics = Metrics(scheduler)
    scheduler.metrics = metrics
    more = Endpoints(h, metrics)
    routes = [
        Route("/health", h.health, methods=["GET"]),
        Route("/v1/models", h.models, methods=["GET"]),
        Route("/v1/models/{model:path}", more.model, methods=["GET"]),
        Route("/metrics", more.metrics_text, methods=["GET"]),
        Route("/tokenize", more.tokenize, methods=["POST"]),
        Route("/detokenize", more.detokenize, methods=["POST"]),
        Route("/v1/embeddings", more.embeddings, methods=["GET", "POST"]),
        Route("/stats", h.stats, methods=["GET"]),
        Route("/v1/completions", h.completions, methods=["POST"]),
        Route("/v1/chat/completions", h.chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        HTTPException: _http_error, Exception: _server_error})
    app.state.handlers = h
    return app


__all__ = ["build_app", "read_body"]
