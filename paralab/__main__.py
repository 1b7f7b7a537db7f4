"""``python -m paralab`` and ``torchrun -m paralab`` (the same CLI as the ``paralab`` command)."""

import sys

from paralab.cli import main

if __name__ == "__main__":
    sys.exit(main())
