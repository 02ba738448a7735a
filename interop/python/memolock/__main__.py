"""python3 -m memolock run ... (see cli.py)."""

import sys

from .cli import main

sys.exit(main(prog="python3 -m memolock"))
