"""Shared by every test folder: `tests/support` (helpers such as a hand-made Hugging Face hub cache) on sys.path,
since the tests run with --import-mode=importlib."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))
