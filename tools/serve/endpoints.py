"""The routes beside completions: ``/tokenize`` and ``/detokenize`` (vLLM's shapes),
``/v1/models/{id}``, ``/metrics`` (Prometheus) and ``/v1/embeddings`` (404: a graph's
output is next-token logits, not an embedding). Each checks its body as the completion
routes do (unknown fields refused, 400 naming the field) and runs the tokenizer on the
server's tokenizing threads, within ``--tokenize-timeout``. No MLX here."""

from starlette.responses import JSONResponse, Response

from mlxgraph.tools.serve.openai_requests import parse_chat, parse_completion
from mlxgraph.tools.serve.relay import error_response
from mlxgraph.tools.serve.request_fields import RequestError, is_int
from mlxgraph.tools.serve.request_json import parse_json
from mlxgraph.tools.serve.response_models import Detokenized, Tokenized

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "chat_template_kwargs"})
MAX_DETOKENIZE = 1 << 20  # token ids one /detokenize may ask for


class Endpoints:
    """The extra routes over the app's Handlers ``h`` (its model, tokens and scheduler)."""

    def __init__(self, h, metrics):
        self.h, self.metrics = h, metrics

    async def model(self, request):
        h, name = self.h, request.path_params["model"]
        if name != h.model_id:
            return error_response(RequestError(f"model {name!r} does not exist here; this "
                                               f"server runs {h.model_id!r}", "model",
                                               status=404, code="model_not_found"))
        return JSONResponse(h.model_card().dump())

    async def metrics_text(self, request):
        return Response(self.metrics.text(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def embeddings(self, request):
        return error_response(RequestError(
            "this server has no embeddings: a .mlxg graph computes next-token logits, not "
            "an embedding of its input", status=404, kind="not_found", code="not_supported"))

    async def tokenize(self, request):
        """{"prompt": text or ids} or {"messages": [...], "chat_template_kwargs"?} ->
        {"tokens", "count", "max_model_len"} (chat: the template applied, with the
        assistant turn's opening, as /v1/chat/completions feeds the model)."""
        h = self.h
        try:
            doc = parse_json(await h.body(request))
            extra = set(doc) - TOKENIZE_FIELDS
            if extra:
                raise RequestError(f"unknown field '{sorted(extra)[0]}'", sorted(extra)[0])
            if ("prompt" in doc) == ("messages" in doc):
                raise RequestError("give one of 'prompt' or 'messages'", "prompt")
            req = parse_chat(doc) if "messages" in doc else parse_completion(doc)
            if len(req.prompts) > 1:
                raise RequestError("'prompt' must be one prompt here", "prompt")
            h.check_model(req.model)
            ids = (await h.tokens.ids(req))[0]
        except RequestError as e:
            return error_response(e)
        return JSONResponse(Tokenized(tokens=ids, count=len(ids),
                                      max_model_len=h.info.capacity).dump())

    async def detokenize(self, request):
        """{"tokens": [ids]} -> {"prompt": text}."""
        h = self.h
        try:
            doc = parse_json(await h.body(request))
            extra = set(doc) - {"model", "tokens"}
            if extra:
                raise RequestError(f"unknown field '{sorted(extra)[0]}'", sorted(extra)[0])
            h.check_model(doc.get("model"))
            ids = doc.get("tokens")
            vocab = h.info.vocab_size
            if not isinstance(ids, list) or len(ids) > MAX_DETOKENIZE or not all(
                    is_int(t) and 0 <= t < vocab for t in ids):
                raise RequestError(f"'tokens' must be a list of at most {MAX_DETOKENIZE} token "
                                   f"ids in [0, {vocab})", "tokens")
            if h.info.tokenizer is None:
                raise RequestError("this model carries no tokenizer", "tokens")
            text = await h.tokens.decode(ids, "tokens")
        except RequestError as e:
            return error_response(e)
        return JSONResponse(Detokenized(prompt=text).dump())


__all__ = ["Endpoints"]
