"""A table of registered functions filled lazily by the modules that register them.

The interpreter's kernels and token rules and the exporter's lowerings are such tables:
each op module registers its functions on import, and the table imports its modules on
first lookup, so importing the registry (to register) never imports every op module. A
key registers once: a second registration is refused, never silently kept.
"""

from importlib import import_module


class LazyRegistry:
    """A dict of entries, filled on first lookup by importing ``package``'s ``modules``.

    Args:
        package: the package holding the op modules (its ``__name__``).
        modules: the op modules' names within the package.
    """

    def __init__(self, package: str, modules: tuple):
        self.package = package
        self.modules = modules
        self.entries: dict = {}
        self._loaded = False

    def add(self, key, entry) -> None:
        """Register ``entry`` under ``key``.

        Raises:
            ValueError: ``key`` is already registered (two functions for one op would
                leave the winner to import order).
        """
        if key in self.entries:
            raise ValueError(f"{self.package}: {key!r} is already registered")
        self.entries[key] = entry

    def table(self) -> dict:
        """Every registered entry by key (imports the op modules on first use)."""
        if not self._loaded:
            for m in self.modules:
                import_module(f"{self.package}.{m}")
            self._loaded = True
        return self.entries
