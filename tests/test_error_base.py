"""One error base: every exception class the package defines is an ``mlxgraph.Error``,
and the public ones keep their old built-in parents so existing ``except`` clauses match."""

import importlib
import inspect

import pytest

import mlxgraph
from tests.test_house_rules import package_sources


def _package_exception_classes() -> dict:
    """{qualified name: class} of every exception class defined in a package module."""
    found = {}
    for name in package_sources():
        if name.endswith("__main__"):
            continue  # running it is its only job
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == name):
                found[f"{name}.{attr}"] = value
    return found


def test_every_package_exception_is_an_mlxgraph_error():
    """A new error type that forgets the base fails here, naming it."""
    classes = _package_exception_classes()
    assert len(classes) >= 20, sorted(classes)  # the walk really found them
    strays = sorted(n for n, c in classes.items()
                    if not issubclass(c, mlxgraph.Error) and not issubclass(c, Warning))
    assert not strays, f"not an mlxgraph.Error: {strays}"


@pytest.mark.parametrize("name, old_base", [
    ("SessionError", ValueError), ("CacheError", ValueError), ("CacheFileError", ValueError),
    ("GraphRuntimeError", RuntimeError), ("PipelineError", RuntimeError),
    ("BlasError", RuntimeError), ("KnobError", ValueError), ("GraphFormatError", Exception),
    ("TokenizerError", Exception),
])
def test_public_errors_keep_their_old_parents(name, old_base):
    """``except mlxgraph.Error`` catches each public error; old handlers still do too."""
    cls = getattr(mlxgraph, name)
    assert issubclass(cls, mlxgraph.Error) and issubclass(cls, old_base)
    assert name in mlxgraph.__all__ and "Error" in mlxgraph.__all__


def test_a_bad_file_is_caught_as_mlxgraph_error(tmp_path):
    """What a user writes: one except clause for whatever mlxgraph refuses."""
    path = tmp_path / "bad.mlxg"
    path.write_bytes(b"not a graph file at all")
    with pytest.raises(mlxgraph.Error, match="bad.mlxg"):
        mlxgraph.load(path)
