"""What stateful kernels see of the running step (``ctx``): the session's KV stores."""


class StepContext:
    """What stateful kernels see of the running step: the session's KV stores (positions
    are not here: the session checked them against the stores before the step began)."""

    __slots__ = ("stores",)

    def __init__(self, stores):
        self.stores = stores

    def store(self, layer_id):
        """The KV store of ``layer_id``."""
        return self.stores[layer_id]
