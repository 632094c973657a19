"""Reliability tests: make the server tests' helpers (`server_support`) and this folder's importable."""

import sys
from pathlib import Path

here = Path(__file__).parent
sys.path.insert(0, str(here))
sys.path.insert(0, str(here.parent / "server"))
