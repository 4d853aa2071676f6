"""The jinja2 environment chat templates render in: transformers' sandbox, each step charged.

The environment is transformers' (``ImmutableSandboxedEnvironment``, ``trim_blocks``,
``lstrip_blocks``, loop controls, a ``tojson`` that does not escape HTML, the
``raise_exception`` and ``strftime_now`` globals). On top of the sandbox, every step a
template takes goes through the render's Budget (interpreter/text/template_budget.py): each loop
iteration, call, operator, comparison, ``~`` join, list/tuple/dict literal and output piece
is charged, with an estimate made before the work (interpreter/text/template_estimates.py);
calls count as nested. Only the string, container, loop and macro methods and the filters
with an estimate can be called (``lipsum`` and a few filters chat templates never use are
gone); anything else is refused, never run unbounded.
"""

import json
import operator
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import BlockReference, LoopContext, Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError, safe_range
from jinja2.utils import Cycler, Joiner, Namespace

from mlxgraph.interpreter.text.template_budget import TemplateLimitError, current
from mlxgraph.interpreter.text.template_estimates import (
    CONTAINER_METHODS,
    FILTERS,
    MAX_INT_BITS,
    STR_METHODS,
    TESTS_WALKING,
    binop_size,
    format_size,
    percent_size,
    text_size,
)

_COMPARE = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "gteq": operator.ge,
            "lt": operator.lt, "lteq": operator.le, "in": lambda a, b: a in b,
            "notin": lambda a, b: a not in b}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _walk_args(args, kwargs, budget) -> int:
    return budget.size(list(args) + list(kwargs.values()), "the arguments")


_GLOBALS = {  # callable globals -> units before the call
    safe_range: lambda a, k, b: 1,
    dict: _walk_args,
    Namespace: _walk_args,
    Cycler: _walk_args,
    Joiner: _walk_args,
    raise_exception: lambda a, k, b: 1,
    strftime_now: lambda a, k, b: 16 * text_size(a[0] if a else "", b),
}


class _Generator(CodeGenerator):
    """Routes loops, ``~``, comparisons and literals through the environment's checks."""

    def visit_For(self, node, frame):
        node.iter = nodes.Call(nodes.EnvironmentAttribute("mlxg_loop"), [node.iter], [],
                               None, None, lineno=node.lineno)
        super().visit_For(node, frame)

    def visit_Concat(self, node, frame):
        self.write("environment.mlxg_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_Compare(self, node, frame):
        self.write(f"environment.mlxg_compare({tuple(op.op for op in node.ops)!r}, ")
        self.visit(node.expr, frame)
        for op in node.ops:
            self.write(", ")
            self.visit(op.expr, frame)
        self.write(")")

    def _literal(self, visit, node, frame):
        self.write("environment.mlxg_literal(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node, frame):
        self._literal(super().visit_List, node, frame)

    def visit_Dict(self, node, frame):
        self._literal(super().visit_Dict, node, frame)

    def visit_Tuple(self, node, frame):
        if node.ctx != "load":
            return super().visit_Tuple(node, frame)
        self._literal(super().visit_Tuple, node, frame)


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, every step charged to the current render's Budget."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "**", "%"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
                         extensions=["jinja2.ext.loopcontrols"])
        filters = {**self.filters, "tojson": tojson}
        self.filters = {name: _guarded(f"the {name} filter", filters[name], estimate)
                        for name, estimate in FILTERS.items() if name in filters}
        self.tests = {name: _guarded(f"the {name} test", test, _test_units(name))
                      for name, test in self.tests.items()}
        del self.globals["lipsum"]
        self.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)

    def mlxg_loop(self, iterable):
        budget = current()
        for item in iterable:
            budget.charge(1, "a loop")
            yield item

    def mlxg_concat(self, parts):
        budget = current()
        budget.charge(1 + sum(text_size(p, budget) for p in parts), "the '~' operator")
        return "".join(map(str, parts))

    def mlxg_compare(self, ops, *values):
        budget = current()
        for v in values:
            budget.size(v, "a comparison")
        if len(ops) == 1:
            return _COMPARE[ops[0]](values[0], values[1])
        return all(_COMPARE[op](a, b) for op, a, b in zip(ops, values, values[1:]))

    def mlxg_literal(self, value):
        current().size(value, "a literal")
        return value

    def call_binop(self, context, op, left, right):
        budget = current()
        if op == "%" and isinstance(left, str):
            units = percent_size(left, right, budget)
        else:
            units = binop_size(op, left, right)
        budget.charge(units, f"the '{op}' operator")
        return _settle(super().call_binop(context, op, left, right), budget, op)

    def getitem(self, obj, argument):
        budget = current()
        budget.charge(1)
        value = super().getitem(obj, argument)
        if isinstance(argument, slice) and isinstance(value, (str, list, tuple)):
            budget.charge(len(value), "a slice")
        return value

    def getattr(self, obj, attribute):
        current().charge(1)
        return super().getattr(obj, attribute)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
        if getattr(__obj, "__func__", None) is LimitedEnvironment.mlxg_loop:
            return __obj(*args)
        budget = current()
        what = _name(__obj)
        budget.charge(1 + _call_units(__obj, args, kwargs, budget), what)
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (__self.mlxg_loop(args[0]),) + args[1:]
        budget.enter(what)
        try:
            result = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args,
                                                        **kwargs)
        finally:
            budget.leave()
        return _settle(result, budget, what)


def _call_units(obj, args, kwargs, budget) -> int:
    if isinstance(obj, (Macro, LoopContext, Joiner, BlockReference, Undefined)):
        return 0
    estimate = _GLOBALS.get(obj) if _hashable(obj) else None
    if estimate is not None:
        return estimate(args, kwargs, budget)
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    wrapped = getattr(obj, "__wrapped__", None)
    if isinstance(getattr(wrapped, "__self__", None), str):  # str.format(_map), sandboxed
        fmt = wrapped.__self__
        if name == "format_map":
            return format_size(fmt, (), args[0] if args else {}, budget)
        return format_size(fmt, args, kwargs, budget)
    if isinstance(owner, str) and name in STR_METHODS:
        return STR_METHODS[name](owner, args, kwargs, budget)
    if isinstance(owner, (dict, list, tuple)) and name in CONTAINER_METHODS:
        return 1 + len(owner)
    if isinstance(owner, LoopContext) and name in ("cycle", "changed"):
        return _walk_args(args, kwargs, budget)
    if isinstance(owner, Cycler) and name in ("next", "reset"):
        return 1
    raise SecurityError(f"a chat template may not call {_name(obj)}")


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _name(obj) -> str:
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", type(obj).__name__)
    return f"{type(owner).__name__}.{name}" if owner is not None else name


def _settle(result, budget, what):
    """``result``, charged; an iterator is read into a list (each item charged)."""
    if hasattr(result, "__next__") and not isinstance(result, LoopContext):
        items = []
        for item in result:
            budget.charge(1, what)
            items.append(item)
        return items
    if isinstance(result, (str, list, tuple, dict)):
        budget.charge(len(result), what)
    elif isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"{what} made an integer of more than {MAX_INT_BITS} bits")
    return result


def _guarded(what, func, estimate):
    passes = hasattr(func, "jinja_pass_arg")

    def guarded(*args, **kwargs):
        budget = current()
        budget.charge(1 + estimate(args[1:] if passes else args, kwargs, budget), what)
        return _settle(func(*args, **kwargs), budget, what)

    if passes:
        guarded.jinja_pass_arg = func.jinja_pass_arg
    return guarded


def _test_units(name):
    if name in TESTS_WALKING:
        return lambda args, kwargs, budget: _walk_args(args, kwargs, budget)
    return lambda args, kwargs, budget: 0


def _finalize(value):
    """An output expression's value: converting it to text is charged first (at compile
    time, a constant, there is no render and nothing to charge)."""
    if not isinstance(value, str):
        try:
            budget = current()
        except TemplateLimitError:
            return value
        budget.charge(text_size(value, budget), "an output expression")
    return value


__all__ = ["LimitedEnvironment"]
