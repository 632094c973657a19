"""`python -m glimmer`: the `glimmer` command, where the installed script is not on PATH (a `pip install --user`, a
virtual environment that is not activated)."""

import sys

from glimmer.cli import main

sys.exit(main())
