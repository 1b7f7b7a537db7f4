"""``python -m paralab.elastic ...``: the same as ``paralab elastic ...``."""

import sys

from paralab.cli import main

sys.exit(main(["elastic", *sys.argv[1:]]))
