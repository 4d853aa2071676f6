"""A table of registered functions filled lazily by the modules that register them.

The interpreter's kernels and the exporter's lowerings are both such a table: each op
module registers its functions on import, and the table imports its modules on first
lookup, so importing the registry (to register) never imports every op module.
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
        """Register ``entry`` under ``key`` (the last registration of a key wins)."""
        self.entries[key] = entry

    def table(self) -> dict:
        """Every registered entry by key (imports the op modules on first use)."""
        if not self._loaded:
            for m in self.modules:
                import_module(f"{self.package}.{m}")
            self._loaded = True
        return self.entries
