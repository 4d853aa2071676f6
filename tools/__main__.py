"""`python -m mlxgraph.tools` runs the command line."""

import sys

from mlxgraph.tools.cli import main

sys.exit(main())
