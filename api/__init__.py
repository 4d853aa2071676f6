"""mlxgraph: PyTorch language models as portable graph files, run on MLX.

The public entry point is :func:`load`; see DESIGN section 4 for the API.
"""

__version__ = "0.1.0"


def load(path):
    """Load and verify a graph file; return an immutable :class:`Program`.

    Args:
        path: the ``.mlxg`` file.
    Raises:
        mlxgraph.schema.GraphFormatError: the file is not a valid graph file.
    """
    from mlxgraph.interpreter.program import Program

    return Program.load(path)
