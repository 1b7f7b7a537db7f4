"""``python -m paralab.elastic ...``: the same as ``paralab elastic ...``."""

import sys

from paralab.elastic.cli import main

sys.exit(main())
