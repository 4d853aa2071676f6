"""One request's jobs (its choices) relayed to the client: the whole response, or its
server-sent events. Each job posts ``(index, event)`` into the request's one queue (job.py
lists the events); a client that goes away cancels every job of its request. No MLX here.
"""

import asyncio
import json
import logging

from starlette.responses import JSONResponse, Response

from mlxgraph.tools.serve.openai_responses import total_usage
from mlxgraph.tools.serve.request_fields import RequestError
from mlxgraph.tools.serve.response_models import ErrorBody, ErrorDetail
from mlxgraph.tools.serve.tool_calls import parse

log = logging.getLogger("mlxgraph.serve")
GONE = 499  # the client went away: nobody reads this status


def error_response(e: RequestError, retry_after: int = 1) -> JSONResponse:
    """The OpenAI error document of ``e`` with its status (and Retry-After on 429/503)."""
    headers = {"Retry-After": str(retry_after)} if e.status in (429, 503) else None
    return JSONResponse(error_doc(e), status_code=e.status, headers=headers)


def error_doc(e: RequestError) -> dict:
    """OpenAI's error document of ``e``: {"error": {"message", "type", "param", "code"}}."""
    return ErrorBody(error=ErrorDetail(message=e.message, type=e.kind, param=e.param,
                                       code=e.code)).dump()


def _event_error(event) -> RequestError:
    return RequestError(event[2], status=event[1], kind="server_error")


class Relay:
    """The events of ``jobs`` (choice k is ``jobs[k]``) as a response.

    Args:
        scheduler: cancels the jobs; request: the starlette request (its disconnect);
        queue: where the jobs' ``(index, event)`` arrive; builder: the ResponseBuilder;
        req: the TextRequest; prefixes: each choice's text before its tokens (``echo``);
        tools: None, or (function names, syntax) to parse each answer for calls (a stream
            then holds each choice's text until it ends: a call is sent whole).
    """

    def __init__(self, scheduler, request, jobs, queue, builder, req, prefixes, tools=None):
        self.scheduler, self.request, self.jobs, self.queue = scheduler, request, jobs, queue
        self.builder, self.req, self.prefixes, self.tools = builder, req, prefixes, tools

    def cancel(self) -> None:
        """Stop every job of the request (each frees its session at the next round)."""
        for job in self.jobs:
            self.scheduler.cancel(job)

    async def next(self):
        """The next ``(index, event)``, or None (the jobs cancelled) when the client goes."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        getter = asyncio.ensure_future(self.queue.get())
        watcher = asyncio.ensure_future(_disconnected(self.request))
        try:
            await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if getter.done():
            return getter.result()
        getter.cancel()
        self.cancel()
        log.info("request %d: the client went away; cancelled", self.jobs[0].number)
        return None

    async def whole(self, item):
        """The non-streaming response, from the first ``(index, event)`` on."""
        count = len(self.jobs)
        pieces = [[p] for p in self.prefixes]
        entries = [[] for _ in range(count)]
        finish, usages = [None] * count, [None] * count
        while True:
            k, event = item
            if event[0] == "token":
                pieces[k].append(event[1])
                if event[3] is not None:
                    entries[k].append((event[2], event[1], event[3]))
            elif event[0] == "done":
                finish[k], usages[k] = event[1], event[2]
                if all(u is not None for u in usages):
                    break
            else:
                self.cancel()
                return error_response(_event_error(event))
            item = await self.next()
            if item is None:
                return Response(status_code=GONE)
        choices = [self._answer("".join(p), f) + (e,) for p, f, e in zip(pieces, finish,
                                                                          entries)]
        return JSONResponse(self.builder.whole(choices, total_usage(usages, self.req.n)))

    def _answer(self, text, finish) -> tuple:
        """(content, finish_reason, tool calls) of a choice's whole text."""
        if self.tools is None or finish != "stop":
            return text, finish, []
        content, calls = parse(text, *self.tools)
        return content, "tool_calls" if calls else finish, calls

    async def events(self, item):
        """The server-sent events, from the first ``(index, event)`` on."""
        builder, req, done = self.builder, self.req, False
        usages = [None] * len(self.jobs)
        held = [[] for _ in self.jobs]  # with tools: each choice's text until it ends
        try:
            for k, prefix in enumerate(self.prefixes):
                if req.kind == "chat":
                    yield _sse(builder.chunk("", first=True, index=k))
                elif prefix:
                    yield _sse(builder.chunk(prefix, index=k))
            while True:
                k, event = item
                if event[0] == "token":
                    # A token that leaves a character incomplete sends nothing (no empty
                    # delta), unless the client asked for its log-probability.
                    lp = [(event[2], event[1], event[3])] if event[3] is not None else ()
                    if self.tools is not None:
                        held[k].append(event[1])
                    elif event[1] or lp:
                        yield _sse(builder.chunk(event[1], lp, index=k))
                elif event[0] == "done":
                    usages[k] = event[2]
                    finish = event[1]
                    if self.tools is not None:
                        content, finish, calls = self._answer("".join(held[k]), finish)
                        if content:
                            yield _sse(builder.chunk(content, index=k))
                        if calls:
                            yield _sse(builder.chunk("", index=k, calls=calls))
                    yield _sse(builder.chunk("", finish_reason=finish, index=k))
                    if all(u is not None for u in usages):
                        done = True
                        if req.include_usage:
                            yield _sse(builder.usage_chunk(total_usage(usages, req.n)))
                        yield "data: [DONE]\n\n"
                        return
                else:
                    done = True
                    self.cancel()  # the request's other choices
                    yield _sse(error_doc(_event_error(event)))
                    yield "data: [DONE]\n\n"
                    return
                item = await self.queue.get()
        finally:
            if not done:  # the client went away (or the server is stopping): free the sessions
                self.cancel()
                log.info("request %d: the stream was closed before its end; cancelled",
                         self.jobs[0].number)


async def _disconnected(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(doc) -> str:
    return f"data: {json.dumps(doc)}\n\n"


__all__ = ["GONE", "Relay", "error_response"]
