"""Upper bounds, before the work, on what one template operation builds or walks.

Each estimate is in the budget's units (characters or items built, plus items walked) and
errs high: an operation is refused when its estimate passes what the render has left.
Operators (``*`` on strings and lists, ``**`` and ``*`` on integers, ``%``-formatting),
string methods, ``str.format`` and the filters a chat template may use each have one;
a method or filter without an estimate is not allowed (interpreter/text/template_sandbox.py).
"""

import re
import string
from collections.abc import Mapping

from mlxgraph.interpreter.text.template_budget import TemplateLimitError

MAX_INT_BITS = 4096  # integers a template computes (2**4096 has 1,234 digits)
MAX_WIDTH_DIGITS = 7  # a format width or precision of 10**7 or more is refused
_DIGITS = re.compile(r"\d+")


def text_size(value, budget) -> int:
    """At most how many characters ``str(value)`` (or a format of it) has."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, float):
        return 330  # '%f' of 1e308
    return 10 * budget.size(value)  # repr: quotes, escapes (\U0001xxxx), separators


def _widths(spec: str) -> int:
    total = 0
    for run in _DIGITS.findall(spec):
        if len(run) >= MAX_WIDTH_DIGITS:
            raise TemplateLimitError(f"a format width or precision of {len(run)} digits")
        total += int(run)
    return total


def percent_size(fmt: str, args, budget) -> int:
    """An upper bound on the length of ``fmt % args``."""
    values = list(args.values()) if isinstance(args, Mapping) else (
        list(args) if isinstance(args, tuple) else [args])
    specs = fmt.count("%")
    total, i = len(fmt), fmt.find("%")
    while i >= 0:  # '%' [ '(' key ')' ] flags width '.' precision: up to the conversion
        j = i + 1
        if fmt.startswith("(", j):
            depth = 0
            while j < len(fmt):
                depth += {"(": 1, ")": -1}.get(fmt[j], 0)
                j += 1
                if depth == 0:
                    break
        k = j
        while k < len(fmt) and not fmt[k].isalpha() and fmt[k] != "%":
            k += 1
        total += _widths(fmt[j:k])
        i = fmt.find("%", k + 1)
    if "*" in fmt:
        total += sum(abs(v) for v in values if isinstance(v, int))
    sizes = [text_size(v, budget) for v in values]
    return total + (specs * max(sizes, default=0) if isinstance(args, Mapping) else sum(sizes))


def format_size(fmt: str, args, kwargs, budget) -> int:
    """An upper bound on the length of ``fmt.format(*args, **kwargs)``."""
    values = list(args) + list(kwargs.values())
    biggest = max((text_size(v, budget) for v in values), default=0)
    total = len(fmt)
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is None:
            continue
        total += biggest + _widths(spec or "")
        if spec and "{" in spec:
            total += sum(abs(v) for v in values if isinstance(v, int))
    return total


def binop_size(op: str, left, right) -> int:
    """Units for ``left op right`` (``%`` on a string goes through percent_size)."""
    ints = all(isinstance(v, int) for v in (left, right))
    if ints and op == "**" and right > 0 and abs(left) > 1:
        bits = left.bit_length() * right
    elif ints and op == "*":
        bits = left.bit_length() + right.bit_length()
    else:
        bits = 0
    if bits > MAX_INT_BITS:
        raise TemplateLimitError(f"an integer '{op}' of about {bits:,} bits "
                                 f"(more than {MAX_INT_BITS})")
    sequences = (str, list, tuple)
    if op == "*" and isinstance(left, int) and isinstance(right, sequences):
        left, right = right, left
    if op == "*" and isinstance(left, sequences) and isinstance(right, int):
        return 1 + len(left) * max(0, right)
    if op == "+" and isinstance(left, sequences) and isinstance(right, sequences):
        return 1 + len(left) + len(right)
    return 1 + bits // 64


def _arg(args, kwargs, index, name, default):
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _int(v) -> int:
    return abs(v) if isinstance(v, int) else len(v) if isinstance(v, str) else 0


def _ints(args, kwargs) -> int:
    return sum(_int(v) for v in list(args) + list(kwargs.values()) if isinstance(v, int))


def _replace(s, args, kwargs, budget):
    new = _arg(args, kwargs, 1, "new", "")
    count = _arg(args, kwargs, 2, "count", None)
    n = text_size(s, budget)
    matches = n + 1 if not isinstance(count, int) or count < 0 else min(count, n + 1)
    return n + matches * text_size(new, budget)


def _join(items, sep, budget):
    n = budget.size(items)
    return 10 * n + text_size(sep, budget) * (len(items) if hasattr(items, "__len__") else n)


def _linear(k):
    return lambda s, args, kwargs, budget: k * text_size(s, budget) + 1


def _width(s, args, kwargs, budget):
    return text_size(s, budget) + _ints(args, kwargs) + 1


# str methods: (the string, its arguments) -> units. Not listed: not callable.
STR_METHODS = {
    **dict.fromkeys(
        ("startswith endswith count find rfind index rindex isalnum isalpha isascii "
         "isdecimal isdigit isidentifier islower isnumeric isprintable isspace istitle "
         "isupper strip lstrip rstrip split rsplit splitlines partition rpartition "
         "removeprefix removesuffix").split(), _linear(2)),
    **dict.fromkeys("lower upper title capitalize casefold swapcase".split(), _linear(3)),
    **dict.fromkeys("center ljust rjust zfill".split(), _width),
    "expandtabs": lambda s, a, k, b: len(s) * max(1, _int(_arg(a, k, 0, "tabsize", 8))) + 1,
    "replace": _replace,
    "join": lambda s, a, k, b: _join(_arg(a, k, 0, "iterable", ()), s, b),
}
CONTAINER_METHODS = {"get", "items", "keys", "values", "copy", "index", "count"}


def _tojson(args, kwargs, budget):
    indent = _arg(args, kwargs, 2, "indent", None)
    separators = _arg(args, kwargs, 3, "separators", None)
    per_item = 12 + 64 * _int(indent or 0) + sum(text_size(s, budget) for s in separators or ())
    return budget.size(args[0] if args else None) * per_item


def _indent(args, kwargs, budget):
    s = args[0] if args else ""
    lines = s.count("\n") + 1 if isinstance(s, str) else text_size(s, budget)
    return text_size(s, budget) + lines * (_int(_arg(args, kwargs, 1, "width", 4)) + 1)


def _wordwrap(args, kwargs, budget):
    n = text_size(args[0] if args else "", budget)
    wrap = _arg(args, kwargs, 3, "wrapstring", None) or "\n"
    return n + (n + 1) * text_size(wrap, budget)


def _sum(args, kwargs, budget):
    start = _arg(args, kwargs, 2, "start", 0)
    items = budget.size(args[0] if args else ())
    return items if isinstance(start, (int, float)) else items * (items + budget.size(start))


def _format(value, args, budget):
    if not isinstance(value, str):
        budget.charge(text_size(value, budget), "the format filter's value")
        value = str(value)
    return percent_size(value, args, budget)


def _over_args(k):
    return lambda args, kwargs, budget: k * sum(
        budget.size(v) for v in list(args) + list(kwargs.values())) + _ints(args, kwargs)


def _first(f):
    return lambda args, kwargs, budget: f(args[0] if args else "", args[1:], kwargs, budget)


# filters: (arguments, keyword arguments) -> units. Not listed: no such filter.
FILTERS = {
    **dict.fromkeys(
        "abs attr count d default first last length float int round safe random "
        "filesizeformat".split(), lambda args, kwargs, budget: 1),
    **dict.fromkeys(
        "list reverse map select reject selectattr rejectattr items min max trim truncate "
        "striptags wordcount batch slice center".split(), _over_args(2)),
    **dict.fromkeys("capitalize lower upper title".split(), _over_args(3)),
    **dict.fromkeys("escape e forceescape".split(), _over_args(6)),
    **dict.fromkeys("string urlencode".split(), _over_args(12)),
    **dict.fromkeys("sort dictsort unique groupby".split(), _over_args(24)),
    "replace": _first(_replace),
    "join": lambda a, k, b: _join(a[0] if a else (), _arg(a, k, 1, "d", ""), b),
    "indent": _indent,
    "wordwrap": _wordwrap,
    "format": lambda a, k, b: _format(a[0] if a else "", k or tuple(a[1:]), b),
    "tojson": _tojson,
    "sum": _sum,
}
TESTS_WALKING = {"in", "eq", "equalto", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">",
                 "ge", ">=", "lessthan", "greaterthan", "sameas"}

__all__ = ["CONTAINER_METHODS", "FILTERS", "MAX_INT_BITS", "STR_METHODS", "TESTS_WALKING",
           "binop_size", "format_size", "percent_size", "text_size"]
