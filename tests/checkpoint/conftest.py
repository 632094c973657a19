"""Checkpoint tests: make `gguf_export` and `mlx_export` (this folder's writers) importable by the test modules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
