"""`python -m mlxgraph` runs the command line (the same as the `mlxgraph` command)."""

import sys

from mlxgraph.tools.cli import main

sys.exit(main())
