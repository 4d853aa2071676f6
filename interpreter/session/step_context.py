"""What stateful kernels see of the running step (``ctx``): the KV stores it writes."""


class StepContext:
    """What stateful kernels see of the running step: the session's KV stores (positions
    are not here: the session checked them against the stores before the step began).

    A batched step (several sessions' tokens packed along the token axis, see
    batch_step.py) also has ``rows``: ``((stores, start, count), ...)``, one per session,
    in packing order; attention then writes and reads each row's own stores.
    """

    __slots__ = ("stores", "rows")

    def __init__(self, stores, rows=None):
        self.stores = stores
        self.rows = rows

    def store(self, layer_id):
        """The KV store of ``layer_id``."""
        return self.stores[layer_id]
