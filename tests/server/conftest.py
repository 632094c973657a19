"""Server tests: make `server_support` (this folder's helpers) importable by the test modules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
