"""Shared plumbing of the tools: opening graph files, errors, token ids, JSON, number printing."""

import contextlib
import json
import math
import os
import resource
import sys
import time

from mlxgraph.schema.errors import Error, GraphFormatError
from mlxgraph.schema.format import format_version

# Version of the JSON documents the tools print (docs/json-output.md); bumped when a key changes
# meaning or disappears. Adding keys does not bump it.
JSON_VERSION = 1


class ToolError(Error):
    """A failure the command reports in one line and exits 2 on (bad usage, unreadable file)."""


def open_checked(path):
    """Open, verify and fully decode a graph file for the tools.

    Everything the tools read (slots, constants, metadata, nodes) is decoded here, so a
    corrupt file fails now, with its name, rather than halfway through a report.

    Args:
        path: the .mlxg file.
    Returns:
        the GraphFile.
    Raises:
        ToolError: the file cannot be read or is not a valid graph file.
    """
    from mlxgraph.schema.reader import open_graph
    from mlxgraph.tools.file_kind import graph_path_problem

    problem = graph_path_problem(path)
    if problem:
        raise ToolError(problem)
    try:
        graph = open_graph(path)
        for part in (
            "symbols",
            "tensors",
            "values",
            "inputs",
            "outputs",
            "constants",
            "metadata",
            "nodes",
        ):
            getattr(graph, part)
    except GraphFormatError as e:
        raise ToolError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a corrupt buffer can fail in many ways
        raise ToolError(f"{path}: not a readable graph file ({type(e).__name__}: {e})") from None
    return graph


def version_string(graph) -> str:
    """The file's format version as 'major.minor'."""
    major, minor = graph.version
    return f"{major}.{minor}"


def json_header(graphs: dict) -> dict:
    """The keys every --json document starts with, for the graph files a command read.

    Args:
        graphs: {'file': g} for one file, {'a': ga, 'b': gb} for two.
    Returns:
        {'format_version': ..., 'json_version': ..., 'tool_format_version': ...}; with one file
        format_version is the file's 'major.minor', with two it is {'a': ..., 'b': ...}.
    """
    versions = {k: version_string(g) for k, g in graphs.items()}
    return json_header_for(versions["file"] if list(versions) == ["file"] else versions)


def json_header_for(version) -> dict:
    """The keys every --json document starts with, given the format version to report.

    Args:
        version: the file's 'major.minor', {'a': ..., 'b': ...} for two files, or None when
            the file's version cannot be read.
    """
    return {
        "format_version": version,
        "json_version": JSON_VERSION,
        "tool_format_version": format_version(),
    }


def _number(kind, text: str, ok, want: str):
    """argparse ``type=`` helper: ``text`` as ``kind`` if ``ok(value)``, else a one-line error."""
    import argparse

    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be {want}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0 below 2**64 (a seed, a top-k)."""
    return _number(int, text, lambda v: 0 <= v < 2**64, "an integer in [0, 2**64)")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 that fits 32 bits (token counts, capacities)."""
    return _number(int, text, lambda v: 1 <= v <= 2**31 - 1, "an integer in [1, 2**31 - 1]")


def positive_count(text: str) -> int:
    """argparse type: an int >= 1 below 2**63 (an element limit)."""
    return _number(int, text, lambda v: 1 <= v < 2**63, "an integer in [1, 2**63)")


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0 (a temperature)."""
    return _number(float, text, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0 (a tolerance)."""
    return _number(float, text, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def probability_mass(text: str) -> float:
    """argparse type: a float in (0, 1] (top-p)."""
    return _number(float, text, lambda v: 0 < v <= 1, "a number in (0, 1]")


def parse_ids(text: str, flag: str = "--prompt-ids") -> list:
    """Token ids from ``--prompt-ids``: '1,2,3' or '1, 2, 3' -> [1, 2, 3].

    Raises:
        ToolError: an entry is not an integer or is negative, ids separated by spaces only
            ('1 2 3' must not silently become 123), or there is none.
    """
    ids = []
    for part in text.split(","):
        part = part.strip()
        if part == "":
            continue
        if len(part.split()) > 1:
            raise ToolError(f"{flag}: separate token ids with commas ({part!r} -> "
                            f"{','.join(part.split())!r})")
        if not part.lstrip("+-").isdigit() or not part.isascii():
            raise ToolError(f"{flag}: {part!r} is not an integer")
        ids.append(int(part))
        if ids[-1] < 0:
            raise ToolError(f"{flag}: token ids are non-negative, got {ids[-1]}")
    if not ids:
        raise ToolError(f"{flag}: no token ids given")
    return ids


def check_vocab(ids, vocab_size: int, path) -> None:
    """Check token ids against a graph's vocabulary (0 = unknown size, not checked).

    Raises:
        ToolError: an id is outside [0, vocab_size); names the graph file.
    """
    bad = [t for t in ids if t < 0 or (vocab_size and t >= vocab_size)]
    if bad:
        raise ToolError(f"{path}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")


_IMPORTED = time.time()


def process_seconds() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere: since this import).

    Export times count from process start: importing torch is part of what the user waits for.
    """
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time() - _IMPORTED


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes.

    VmHWM belongs to this process image; ru_maxrss (the fallback off Linux) carries over
    the parent's peak across fork + exec, so a large parent (a test runner) inflates it.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
        1 if sys.platform == "darwin" else 1024
    )


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def print_json(doc: dict, out=None) -> None:
    """Print a JSON document (non-finite floats as null / "inf" / "-inf", which JSON lacks)."""
    out = out or sys.stdout
    json.dump(_jsonable(doc), out, indent=1, sort_keys=False)
    out.write("\n")


def fail(message: str) -> int:
    """Print ``mlxgraph: message`` to stderr (control characters escaped); returns exit code 2."""
    print(printable(f"mlxgraph: {message}"), file=sys.stderr)
    return 2


def printable(text) -> str:
    """``text`` safe for a terminal: every character Python does not call printable (C0/C1
    controls such as ESC, bidi overrides, zero-width marks...) other than newline and tab
    written as its escape (``\\x1b``). Strings stored in a graph file are data.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


class _EscapingStream:
    """A text stream that writes every string through :func:`printable`."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def __getattr__(self, name):
        return getattr(self.raw, name)


@contextlib.contextmanager
def escaped_output():
    """Within the block, stdout and stderr escape control characters (text reports that
    print names read from graph files: inspect, diff, compare)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _EscapingStream(saved[0]), _EscapingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def fmt_num(x) -> str:
    """A float in a short, stable form (4 significant digits)."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.4g}"


def shape_str(shape) -> str:
    """A slot shape as '[1, T, 768]' (None = dynamic as '?')."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
