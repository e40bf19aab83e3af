"""``python -m wdspack``: the same as the ``wdspack`` command."""

import sys

from .cli import main

sys.exit(main())
