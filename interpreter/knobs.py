"""Every ``MLXGRAPH_*`` environment variable the package reads, declared once
(:data:`KNOBS`), parsed and validated here; docs/knobs.md is their table
(:func:`markdown_table`, checked by tests/test_knobs.py).

One vocabulary for switches: on is ``1``, ``on``, ``yes`` or ``true``; off is ``0``,
``off``, ``no`` or ``false`` (any case; surrounding spaces are ignored). An unset or empty
variable takes its default. A few knobs keep older spellings as aliases, listed in their
entry (``mlx`` for the native kernels' off, ``none`` for the router's). Any other value is
a :class:`KnobError` naming the variable and the values it takes.

Readers ask a knob for its setting (``BLAS_TILE.read(env)``); nothing else in the package
reads an ``MLXGRAPH_*`` variable. This module must not import mlx (interpreter/native/blas.py reads
it before mlx is imported).
"""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from mlxgraph.schema.errors import Error

ON = ("1", "on", "yes", "true")
OFF = ("0", "off", "no", "false")


class KnobError(Error, ValueError):
    """An ``MLXGRAPH_*`` variable holds a value it does not take; the message names the
    variable, its value and the values it takes."""


@dataclass(frozen=True)
class Knob:
    """One environment variable: its name, the values it takes (as the docs table and the
    error say them), its default, what it switches, when it is read, and the parser of its
    value."""

    name: str
    values: str
    default: str
    switches: str
    read_when: str  # when the package reads it (a later change of the variable is not seen)
    parse: Callable[[str], object]  # the stripped value -> the setting; ValueError if invalid

    def raw(self, env=None) -> str | None:
        """The variable as set (``env``, default os.environ), None when unset or empty."""
        value = (os.environ if env is None else env).get(self.name, "")
        return value if value.strip() else None

    def read(self, env=None):
        """The setting: the variable's value parsed, or the default's when it is unset.

        Raises:
            KnobError: the variable holds a value this knob does not take.
        """
        raw = self.raw(env)
        try:
            return self.parse((self.default if raw is None else raw).strip())
        except ValueError:
            raise KnobError(f"{self.name}={raw}: expected {self.values} (docs/knobs.md)") from None


def switch(on_aliases: tuple = (), off_aliases: tuple = ()) -> Callable[[str], bool]:
    """The parser of an on/off knob: True for on, False for off (either vocabulary plus
    this knob's aliases)."""

    def parse(text: str) -> bool:
        word = text.lower()
        if word in ON or word in on_aliases:
            return True
        if word in OFF or word in off_aliases:
            return False
        raise ValueError(text)

    return parse


def _blas_library(text: str) -> str:
    word = text.lower()
    if word == "auto":
        return "auto"
    if word in OFF or word in ("none", "bundled", "reference"):
        return "bundled"
    return text


def _tile(text: str) -> str:
    if text.lower() == "always":
        return "always"
    return "on" if switch(("auto",), ("none",))(text) else "off"


def _blas_threads(text: str) -> tuple | None:
    """None for auto, else (threads, min_work) with min_work 0 for "N"."""
    if text.lower() == "auto":
        return None
    many, colon, work = text.partition(":")
    threads, min_work = int(many), int(work) if colon else 0
    if threads < 1 or min_work < 0 or (colon and min_work < 1):
        raise ValueError(text)
    return threads, min_work


def _threads(text: str) -> int | None:
    """None for auto, else a positive count."""
    if text.lower() == "auto":
        return None
    if int(text) < 1:
        raise ValueError(text)
    return int(text)


def _seconds(text: str) -> float:
    seconds = float(text)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(text)
    return seconds


_PRELOAD = "at the BLAS preload"
BLAS = Knob(
    "MLXGRAPH_BLAS",
    "auto; off (also none, bundled, reference); a library: a path, a name the dynamic "
    "linker finds, or scipy-openblas32",
    "auto",
    "the CBLAS under MLX's matrix products (Linux): auto, the first found of blas.py's "
    "CANDIDATES; off, MLX's bundled reference BLAS; a named library that cannot be used is "
    "an error",
    _PRELOAD,
    _blas_library,
)
BLAS_ROUTER = Knob(
    "MLXGRAPH_BLAS_ROUTER",
    "on; off (also none)",
    "on",
    "the router's matrix-vector and few-row routing (off: every product to the BLAS's "
    "sgemm)",
    _PRELOAD,
    switch(off_aliases=("none",)),
)
BLAS_TILE = Knob(
    "MLXGRAPH_BLAS_TILE",
    "on (also auto); off (also none); always",
    "on",
    "the router's many-row kernel (native/tile_gemm.c, AVX-512): on, for 9..160 rows where "
    "it beats the BLAS; off, never; always, for every product of many rows",
    _PRELOAD,
    _tile,
)
BLAS_MATVEC = Knob(
    "MLXGRAPH_BLAS_MATVEC",
    "on; off (also sgemv)",
    "on",
    "the router's one-row products against a weight read along k (a decode step's x @ W.T, "
    "the LM head too): on, its own kernel (native/matvec_f32.c); off, the BLAS's sgemv",
    _PRELOAD,
    switch(off_aliases=("sgemv",)),
)
BLAS_THREADS = Knob(
    "MLXGRAPH_BLAS_THREADS",
    "auto, N or N:MIN_WORK (positive integers)",
    "auto",
    "the router's threads per product: auto, every available CPU (up to 8) from 1M "
    "multiply-adds, 1 below; N, N for all; N:MIN_WORK, N from MIN_WORK multiply-adds "
    "(unset with OPENBLAS_NUM_THREADS set: the BLAS's own threading)",
    _PRELOAD,
    _blas_threads,
)
NATIVE_ACTIVATIONS = Knob(
    "MLXGRAPH_NATIVE_ACTIVATIONS",
    "on; off (also mlx)",
    "on",
    "all five float32 kernels of the native activations extension: sigmoid, SiLU, the "
    "attention softmax, RMSNorm and RoPE (off: MLX's own ops)",
    "once, at the first of them",
    switch(off_aliases=("mlx",)),
)
QUANTIZED_KERNEL = Knob(
    "MLXGRAPH_QUANTIZED_KERNEL",
    "on (also native); off (also mlx)",
    "on",
    "all kernels of the native matrix-vector extension: the quantized and the "
    "float16/bfloat16 matvec, the quantized weight's dequantize and tiled prefill product "
    "(off: MLX's own ops)",
    "once, at the first of them",
    switch(("native",), ("mlx",)),
)
QUANTIZED_THREADS = Knob(
    "MLXGRAPH_QUANTIZED_THREADS",
    "auto or N (a positive integer; 8 at most are used)",
    "auto",
    "threads of the native matrix-vector kernels and the tiled prefill product (auto: 2, or 1 "
    "on a one-CPU machine)",
    "with MLXGRAPH_QUANTIZED_KERNEL",
    _threads,
)
QUANTIZED_PREFILL = Knob(
    "MLXGRAPH_QUANTIZED_PREFILL",
    "on; off",
    "on",
    "float32 QuantizedLinear steps of more than 8 rows on the CPU: on, the native tiled "
    "product (native/quantized_tile.h, AVX-512: the weight dequantized a tile at a time); "
    "off, the whole weight dequantized, then the BLAS matmul",
    "with MLXGRAPH_QUANTIZED_KERNEL",
    switch(),
)
TOKENIZER_DEADLINE = Knob(
    "MLXGRAPH_TOKENIZER_DEADLINE",
    "seconds (a positive number)",
    "60",
    "how long a command's tokenizer worker may encode or apply the chat template before it "
    "is killed (tools/command_deadline.py)",
    "when a command loads the tokenizer",
    _seconds,
)
GRAPH_CACHE = Knob(
    "MLXGRAPH_GRAPH_CACHE",
    "a folder",
    "",
    "where generate/chat/serve keep the graphs they export from a model folder, Hub repo id "
    "or built-in name (tools/model_graphs.py; empty: $XDG_CACHE_HOME/mlxgraph/graphs, or "
    "~/.cache/mlxgraph/graphs)",
    "when a command is given a model instead of a graph file",
    str,
)
KNOBS = (BLAS, BLAS_ROUTER, BLAS_TILE, BLAS_MATVEC, BLAS_THREADS, NATIVE_ACTIVATIONS,
         QUANTIZED_KERNEL, QUANTIZED_PREFILL, QUANTIZED_THREADS, TOKENIZER_DEADLINE,
         GRAPH_CACHE)


def check_environment(env=None) -> None:
    """Parse every knob (``env``, default os.environ), so a bad value fails before anything
    runs rather than at the first kernel that reads it.

    Raises:
        KnobError: the first knob holding a value it does not take.
    """
    for knob in KNOBS:
        knob.read(env)


def markdown_table() -> str:
    """The knobs as the Markdown table docs/knobs.md holds."""
    rows = ["| variable | values | default | what it switches | read |", "|---|---|---|---|---|"]
    rows += [f"| `{k.name}` | {k.values} | {k.default} | {k.switches} | {k.read_when} |"
             for k in KNOBS]
    return "\n".join(rows)


__all__ = [
    "BLAS",
    "BLAS_ROUTER",
    "BLAS_MATVEC",
    "BLAS_THREADS",
    "BLAS_TILE",
    "GRAPH_CACHE",
    "KNOBS",
    "Knob",
    "KnobError",
    "NATIVE_ACTIVATIONS",
    "OFF",
    "ON",
    "QUANTIZED_KERNEL",
    "QUANTIZED_PREFILL",
    "QUANTIZED_THREADS",
    "TOKENIZER_DEADLINE",
    "check_environment",
    "markdown_table",
    "switch",
]
