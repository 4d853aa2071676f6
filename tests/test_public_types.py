"""The public API is typed (issue 32 item 9): every function ``dir(mlxgraph)`` lists, and
every public method of its classes, annotates each parameter and its return, and the
package ships ``py.typed`` so type checkers read them."""

import inspect
from pathlib import Path

import mlxgraph


def _public_functions():
    for name in dir(mlxgraph):
        if name.startswith("_"):
            continue
        obj = getattr(mlxgraph, name)
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, fn in vars(obj).items():
                if inspect.isfunction(fn) and (not attr.startswith("_") or attr == "__init__"):
                    yield f"{name}.{attr}", fn


def test_every_public_function_is_annotated():
    missing = []
    for name, fn in _public_functions():
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty:
                missing.append(f"{name}({p.name})")
        if not name.endswith("__init__") and sig.return_annotation is inspect.Signature.empty:
            missing.append(f"{name} -> ?")
    assert not missing, missing


def test_the_package_ships_py_typed():
    assert (Path(mlxgraph.__file__).parent / "py.typed").is_file()
