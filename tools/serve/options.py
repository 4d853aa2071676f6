"""What the server allows and how it runs: ``ServeOptions``, from ``mlxgraph serve``'s flags.

Imports nothing heavy (no mlx, no starlette): the command line builds it before the BLAS
preload.
"""

from dataclasses import dataclass, field

from mlxgraph.generation.options import SessionOptions
from mlxgraph.tools.option_table import SERVE_MAX_TOKENS
from mlxgraph.tools.text_options import GraphSource


@dataclass(frozen=True)
class ServeOptions:
    """The server's options.

    Args:
        source: the graph and how to load it (--tokenizer, --compute-dtype, --element-limit).
        session: every request's session (--capacity, --prefill-chunk, which is also about
            the most prompt tokens one scheduler round prefills, --kv-dtype, --kv-bits,
            --kv-group-size, --window).
        max_tokens: the most tokens one request may ask for, and what it gets by default.
        max_sessions: requests generating at once; max_queue: requests waiting for a slot
            (more get 429).
        cache_bytes: kept sessions' KV budget for prefix reuse (0: no reuse).
        sampling: the server-wide sampling defaults ({field: value} of --temp, --top-k,
            --top-p, --min-p, --seed as given), for the requests that do not set a field.
    """

    source: GraphSource
    session: SessionOptions
    max_tokens: int = SERVE_MAX_TOKENS
    max_sessions: int = 16
    max_queue: int = 64
    cache_bytes: int = 1 << 30
    sampling: dict = field(default_factory=dict)


__all__ = ["ServeOptions"]
