"""Moved to bench/data/unk_rates.py: this old path runs it, with a note, until the next release
(bench/moved.py)."""

import sys

from moved import forward  # this script's folder, bench/, is first on its path

forward(__file__, sys.argv[1:])
