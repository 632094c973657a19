"""Checkpoint tests: make `gguf_export`, `mlx_export` and `quantized_fixtures` (this folder's writers) and the server
tests' helpers (`serve_process`, for a checkpoint served by `glimmer serve`) importable by the test modules."""

import sys
from pathlib import Path

here = Path(__file__).parent
sys.path.insert(0, str(here))
sys.path.insert(0, str(here.parent / "server"))
