"""``python -m superfile.cli``: the ``superfile`` command, where its console script is not on PATH."""

import sys

from superfile.cli import main

sys.exit(main())
