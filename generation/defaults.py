"""The generation library's defaults, which the CLI's options and the server share.

Imports nothing (in particular not mlx), so the command line can read them before the
BLAS preload.
"""

DEFAULT_MAX_TOKENS = 128
DEFAULT_PREFILL_CHUNK = 512
