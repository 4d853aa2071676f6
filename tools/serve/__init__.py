"""`mlxgraph serve`: an OpenAI-compatible HTTP server over one Program (docs/serve.md).

Modules: options (ServeOptions, from the command line's flags), openai_requests (request
bodies, checked), response_models (the response bodies, declared), openai_responses
(building them), prefix_cache (kept sessions, LRU
under a memory budget), job (one request's state), scheduler (the one thread that touches
MLX), app (the starlette routes), server (uvicorn, signals, shutdown).
"""
