"""From the parsed text options (tools/option_table.py) to what the library takes: the graph
to open (``GraphSource``), ``SessionOptions`` and ``SamplingOptions`` (generation/options.py).

This is the command line's edge: past it, nothing reads an argparse namespace. A bad value
is a ToolError naming the flag. Nothing here imports mlx at module level (the CLI builds
its parser before the BLAS preload); ``GraphSource.open`` and ``open_session`` import it.
"""

from dataclasses import dataclass, fields
from pathlib import Path

from mlxgraph.generation.options import OptionError, SamplingOptions, SessionOptions
from mlxgraph.tools.file_kind import graph_path_problem
from mlxgraph.tools.output import ToolError

# Sampling settings of the library and the server that no command-line flag sets.
API_ONLY = frozenset({"presence_penalty", "frequency_penalty", "logit_bias"})


def _flag(e: OptionError) -> ToolError:
    """The option's error, naming the flag that set it (``top_p`` -> ``--top-p``)."""
    return ToolError(f"--{e.option.replace('_', '-')} {e.requirement}")


def session_options(args) -> SessionOptions:
    """The session flags (--capacity, --prefill-chunk, --kv-dtype, --kv-bits,
    --kv-group-size, --window), checked.

    Raises:
        ToolError: naming the flag.
    """
    try:
        return SessionOptions(**{f.name: getattr(args, f.name) for f in fields(SessionOptions)})
    except OptionError as e:
        raise _flag(e) from None


def sampling_options(args) -> SamplingOptions:
    """The sampling flags (--temperature, --top-k, --top-p, --min-p, --repetition-penalty,
    --seed), checked.

    Raises:
        ToolError: naming the flag.
    """
    try:
        return SamplingOptions(**{f.name: getattr(args, f.name) for f in fields(SamplingOptions)
                                  if f.name not in API_ONLY})
    except OptionError as e:
        raise _flag(e) from None


def sampling_defaults(args, names) -> dict:
    """{field: value} of the sampling flags among ``names`` that were given (serve's
    server-wide defaults), checked as a sampled request's settings, or, with --temp 0, as a
    greedy one's: a filter or seed beside --temp 0 is refused, as generate refuses it (a
    request's own are accepted and change nothing: OpenAI clients send them).

    Raises:
        ToolError: naming the flag.
    """
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    try:
        SamplingOptions(**{"temperature": 1.0, **given})
    except OptionError as e:
        raise _flag(e) from None
    return given


@dataclass(frozen=True)
class GraphSource:
    """The graph file to load and how: --tokenizer DIR, --compute-dtype, --element-limit,
    and a pipeline rank's load options (generate --pipeline)."""

    graph: str
    tokenizer: str | None = None
    compute_dtype: str | None = None
    element_limit: int | None = None
    pipeline: bool = False
    pipeline_timeout: float | None = None
    chat_template: str | None = None  # --chat-template NAME|FILE
    int8_activations: bool = False    # --int8-activations

    @classmethod
    def of(cls, args) -> "GraphSource":
        """The source the command line names (GRAPH and its load flags)."""
        from mlxgraph.tools.pipeline_cli import load_options

        return cls(args.graph, args.tokenizer, args.compute_dtype, args.element_limit,
                   **load_options(args), chat_template=args.chat_template,
                   int8_activations=bool(args.int8_activations))

    def check(self) -> None:
        """Refuse a graph path that is not a graph file, or a tokenizer that is not a folder.

        Raises:
            ToolError: saying which.
        """
        problem = graph_path_problem(self.graph)
        if problem:
            raise ToolError(problem)
        if self.tokenizer is not None and not Path(self.tokenizer).is_dir():
            raise ToolError(f"--tokenizer: {self.tokenizer}: not a folder")
        self.template()

    def template(self):
        """The --chat-template chosen (generation/chat_templates.py), or None.

        Raises:
            ToolError: not a built-in name nor a readable file.
        """
        if self.chat_template is None:
            return None
        from mlxgraph.generation.chat_templates import chat_template

        try:
            return chat_template(self.chat_template)
        except ValueError as e:
            raise ToolError(f"--chat-template: {e}") from None

    def open(self, need_tokenizer: bool, deadline: bool = False):
        """(program, tokenizer or None); ``deadline``: a command's (tools/command_deadline.py:
        encode and the chat template in a worker process).

        Raises:
            ToolError: the graph cannot be loaded, or the tokenizer when ``need_tokenizer``.
        """
        from mlxgraph.interpreter.errors import PipelineError
        from mlxgraph.interpreter.program import Program
        from mlxgraph.interpreter.text.tokenizer import TokenizerError, load_tokenizer
        from mlxgraph.schema.errors import GraphFormatError

        pipeline = {"pipeline": True, "pipeline_timeout": self.pipeline_timeout} \
            if self.pipeline else {}
        try:
            program = Program.load(self.graph, compute_dtype=self.compute_dtype,
                                   element_limit=self.element_limit,
                                   int8_activations=self.int8_activations, **pipeline)
        except (GraphFormatError, PipelineError) as e:
            raise ToolError(str(e)) from None
        except ValueError as e:  # the load options' refusals, named as the flag is
            raise ToolError(str(e).replace("int8_activations", "--int8-activations", 1)) from None
        except OSError as e:
            raise ToolError(f"{self.graph}: cannot read ({e.strerror or e})") from None
        try:
            tokenizer = load_tokenizer(program.metadata, folder=self.tokenizer)
        except TokenizerError as e:
            if need_tokenizer:
                where = "--tokenizer" if self.tokenizer is not None else self.graph
                raise ToolError(f"{where}: {e}") from None
            tokenizer = None
        if deadline:
            from mlxgraph.tools.command_deadline import with_deadline

            tokenizer = with_deadline(tokenizer)
        template = self.template()
        if template is not None and tokenizer is not None:
            from mlxgraph.generation.chat_templates import TemplatedTokenizer

            tokenizer = TemplatedTokenizer(tokenizer, template)
        return program, tokenizer


def template_stops(source) -> list:
    """The stop strings of ``source``'s --chat-template (a built-in's turn end), else []."""
    template = source.template()
    return list(template.stops) if template is not None else []


@dataclass(frozen=True)
class TextOptions:
    """What `generate` and `chat` run with: the graph, the session and the sampling."""

    source: GraphSource
    session: SessionOptions
    sampling: SamplingOptions


def text_options(args) -> TextOptions:
    """The checked options of `generate` or `chat`, refused before anything is loaded.

    Raises:
        ToolError: naming the flag (a bad value, an empty --stop), or a graph path that is
            not a graph file, or a --tokenizer that is not a folder.
    """
    from mlxgraph.tools.model_graphs import use_model_graph

    session, sampling = session_options(args), sampling_options(args)
    if not all(args.stop):
        raise ToolError("--stop: a stop string must not be empty")
    use_model_graph(args)  # (a model folder, repo id or built-in: its cached graph)
    source = GraphSource.of(args)
    source.check()
    return TextOptions(source, session, sampling)


def open_session(program, options: SessionOptions, graph):
    """A new session of ``program`` with ``options``.

    Raises:
        ToolError: a setting the graph cannot honour, naming ``graph``.
    """
    from mlxgraph.interpreter.cache.kv_cache import CacheError
    from mlxgraph.interpreter.errors import SessionError

    try:
        return options.open(program)
    except (SessionError, CacheError) as e:
        raise ToolError(f"{graph}: {e}") from None


__all__ = [
    "GraphSource",
    "TextOptions",
    "open_session",
    "sampling_defaults",
    "sampling_options",
    "session_options",
    "text_options",
]
