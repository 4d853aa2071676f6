"""The budget one chat-template render runs under: units of work and allocation, a
wall-clock deadline, nested calls.

A unit is one character or container item built, one item walked, or one operation of the
template (a loop iteration, a call, an operator); a render may spend ``units`` plus
``per_input`` units per unit of its input (the conversation's own size), so a long
conversation is not refused for being long. Every operation that could build or walk much
is estimated first and refused when its estimate passes what is left, so no single step
of a render allocates past the budget or runs long in C; the deadline is checked between
steps. The values' sizes are logical: an item shared twice counts twice (what a
comparison, ``str()`` or ``tojson`` would walk). docs/architecture.md#chat-templates-and-tokenizers.
"""

import time
from contextvars import ContextVar
from dataclasses import dataclass

from mlxgraph.schema.errors import Error

MAX_DEPTH = 64  # nesting of a value walked (a cycle through a namespace stops here)


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may spend."""

    units: int = 4 << 20  # base budget: about 4 M characters or items
    per_input: int = 8  # units more per unit of the conversation's size
    seconds: float = 5.0  # wall-clock deadline
    calls: int = 32  # calls nested in calls (macros calling macros)
    source_chars: int = 1 << 20  # the template's own text


class TemplateLimitError(Error):
    """A render passed one of its limits (the message says which)."""


class Budget:
    """The spending of one render (one thread's; see :func:`current`)."""

    def __init__(self, limits: TemplateLimits, input_size: int):
        self.limits = limits
        self.total = limits.units + limits.per_input * input_size
        self.left = self.total
        self.deadline = time.monotonic() + limits.seconds
        self.depth = 0
        self._ticks = 0

    def charge(self, units: int, what: str = "the template") -> None:
        """Spend ``units`` (refused, spending nothing, past what is left or the deadline).

        Raises:
            TemplateLimitError: over the budget or past the deadline.
        """
        if units > self.left:
            raise TemplateLimitError(
                f"{what} needs {units:,} more units of work or memory, over the render's "
                f"budget of {self.total:,}"
            )
        self.left -= units
        self._ticks += 1
        if units > 4096 or not self._ticks & 63:
            self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(
                f"the render ran past its time limit of {self.limits.seconds:g} s"
            )

    def enter(self, what: str) -> None:
        """One call deeper (``leave`` when it returns)."""
        if self.depth >= self.limits.calls:
            raise TemplateLimitError(
                f"{what}: calls nested deeper than {self.limits.calls}"
            )
        self.depth += 1

    def leave(self) -> None:
        self.depth -= 1

    def size(self, value, what: str = "a value") -> int:
        """``value``'s logical size, the walk charged; refused past what is left."""
        n = deep_size(value, self.left, what, self.check_time)
        self.charge(n, what)
        return n


_current: ContextVar = ContextVar("mlxgraph_template_budget", default=None)


def current() -> Budget:
    """The budget of the render running in this thread (context)."""
    budget = _current.get()
    if budget is None:
        raise TemplateLimitError("a chat template ran outside a render")
    return budget


def running(budget: Budget):
    """Make ``budget`` current; returns the token for :func:`finished`."""
    return _current.set(budget)


def finished(token) -> None:
    _current.reset(token)


def deep_size(value, limit: int, what: str = "a value", tick=None) -> int:
    """Characters and items reachable from ``value``, shared items counted each time
    (what a comparison or ``str()`` walks), computed once per object shared; ``tick()`` is
    called every 65,536 objects.

    Raises:
        TemplateLimitError: past ``limit``, or nested deeper than MAX_DEPTH (a cycle).
    """
    sizes, stack, walked, keep = {}, [(value, 0, None)], 0, []
    while stack:
        v, depth, children = stack.pop()
        if children is None:  # first visit: its children first
            children = _children(v)
            if children is None or id(v) in sizes:
                continue
            if depth >= MAX_DEPTH:
                raise TemplateLimitError(f"{what} is nested deeper than {MAX_DEPTH} levels")
            keep.append(children)  # items made for the walk (a view's pairs) keep their ids
            stack.append((v, depth, children))
            stack.extend((c, depth + 1, None) for c in children if _children(c) is not None)
            walked += 1
            if tick is not None and not walked & 0xFFFF:
                tick()
            continue
        total = 1 + sum(sizes[id(c)] if id(c) in sizes else _leaf(c) for c in children)
        if total > limit:
            raise TemplateLimitError(
                f"{what} holds more than {limit:,} characters or items, over the render's "
                "budget")
        sizes[id(v)] = total
    size = sizes.get(id(value))
    return size if size is not None else _leaf(value)


def _leaf(v) -> int:
    if isinstance(v, (str, bytes)):
        return len(v) + 1
    if isinstance(v, int):
        return 1 + v.bit_length() // 64
    if isinstance(v, range):
        return 1 + len(v)
    return 1


def _children(v):
    """The items a container holds (a mapping's keys and values), else None."""
    from jinja2.utils import Namespace

    if isinstance(v, Namespace):
        v = v._Namespace__attrs
    if isinstance(v, dict):
        return [x for pair in v.items() for x in pair]
    if isinstance(v, (list, tuple, set, frozenset)) or _is_view(v):
        return list(v)
    return None


def _is_view(v) -> bool:
    return type(v).__name__ in ("dict_keys", "dict_values", "dict_items")


__all__ = ["Budget", "TemplateLimitError", "TemplateLimits", "current", "deep_size"]
